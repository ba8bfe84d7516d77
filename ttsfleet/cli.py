"""The ``ttsfleet`` command line: one root app, one sub-app per component.

Each component owns its sub-app in its own ``cli.py``; those modules keep heavy imports (torch,
kopf) inside the command functions so ``ttsfleet simulate`` starts fast. Bad input anywhere ends
as one line on stderr and exit code 2 (see :mod:`ttsfleet.errors`): usage errors (a missing
option, a value of the wrong type, an unknown option) as well as :class:`~ttsfleet.errors.UserError`
raised by a command and the input errors the standard library raises (a full disk, a file that
cannot be read).
"""

from __future__ import annotations

import sys

import typer

from ttsfleet.contracts.exits import USAGE
from ttsfleet.errors import UserError, one_line, validation_text

app = typer.Typer(
    name="ttsfleet",
    help="TTS inference fleet operations: simulate, serve, fill, operate, Slurm.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from ttsfleet.sim.cli import register as register_sim

    register_sim(app)
    # Component sub-apps. Each module defines `app` (a typer.Typer) and imports nothing heavy.
    from ttsfleet.fill_jobs.cli import app as fill_app
    from ttsfleet.inference.cli import register as register_inference
    from ttsfleet.kernels.cli import app as kernels_app
    from ttsfleet.observability.cli import app as dashboards_app
    from ttsfleet.operator.cli import app as operator_app
    from ttsfleet.slurm.cli import app as slurm_app

    app.add_typer(fill_app, name="fill", help="Checkpointable data-cleaning fill jobs.")
    app.add_typer(slurm_app, name="slurm", help="Slurm partitions, fill agent and exporter.")
    app.add_typer(operator_app, name="operator", help="The Kubernetes operator (kopf).")
    app.add_typer(kernels_app, name="kernels", help="FP8 kernels: checks and benchmarks.")
    app.add_typer(dashboards_app, name="dashboards", help="Grafana dashboards and Prometheus rules.")
    register_inference(app)
    from ttsfleet.devtools.democli import register as register_demo

    register_demo(app)


_register()


def _exception_types() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """(usage errors, aborts, exits) as typer really raises them.

    Recent typer releases vendor their own copy of click (``typer._click``) whose exceptions are
    not the standalone ``click`` package's, so catching ``click.ClickException`` misses every
    usage error. ``typer.BadParameter`` is always a subclass of the ``ClickException`` typer
    raises, whichever click that is; standalone click's classes are added for commands built on
    plain click.
    """
    errors = {next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")}
    aborts: set[type] = {typer.Abort}
    exits: set[type] = {typer.Exit}
    try:
        import click.exceptions as standalone
    except ImportError:  # pragma: no cover - typer without standalone click
        pass
    else:
        errors.add(standalone.ClickException)
        aborts.add(standalone.Abort)
        exits.add(standalone.Exit)
    return tuple(errors), tuple(aborts), tuple(exits)


def usage_line(exc: BaseException) -> str:
    """One line for a click usage error: ``ttsfleet fill run: Missing option '--input'...``."""
    ctx = getattr(exc, "ctx", None)
    where = f"{ctx.command_path}: " if ctx is not None else ""
    text = exc.format_message() if hasattr(exc, "format_message") else str(exc)
    hint = " (see --help)" if ctx is not None else ""
    return f"{where}{one_line(Exception(text))}{hint}"


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning user errors into exit code 2 with one line."""
    from pydantic import ValidationError

    errors, aborts, exits = _exception_types()
    try:
        # With standalone_mode=False click returns the code of typer.Exit / ctx.exit instead of
        # exiting; keep it, or `raise typer.Exit(1)` would end as 0.
        rc = app(args=argv, prog_name="ttsfleet", standalone_mode=False)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ValidationError as exc:
        print(f"error: invalid input: {one_line(Exception(validation_text(exc)))}", file=sys.stderr)
        return USAGE
    except errors as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # a bare group: its help is the answer
            exc.show()
        else:
            print(f"error: {usage_line(exc)}", file=sys.stderr)
        return USAGE
    except aborts:
        print("aborted", file=sys.stderr)
        return 130
    except exits as exc:
        return int(getattr(exc, "exit_code", 0) or 0)
    except SystemExit as exc:  # sys.exit inside a command
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except OSError as exc:
        # Input/output the user can fix: a full disk, a read-only or missing directory.
        where = f" {exc.filename}" if exc.filename else ""
        print(f"error:{where}: {exc.strerror or one_line(exc)}", file=sys.stderr)
        return USAGE
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())

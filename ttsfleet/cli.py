"""The ``ttsfleet`` command line: one root app, one sub-app per component.

Each component owns its sub-app in its own ``cli.py``; those modules keep heavy imports (torch,
kopf) inside the command functions so ``ttsfleet simulate`` starts fast. Bad input anywhere ends
as one line on stderr and exit code 2 (see :mod:`ttsfleet.errors`).
"""

from __future__ import annotations

import sys

import typer

from ttsfleet.errors import UserError, one_line

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


_register()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turning user errors into exit code 2 with one line."""
    from pydantic import ValidationError

    try:
        # With standalone_mode=False click returns the code of typer.Exit / ctx.exit instead of
        # exiting; keep it, or `raise typer.Exit(1)` would end as 0.
        rc = app(args=argv, standalone_mode=False)
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ValidationError as exc:
        errs = "; ".join(
            f"{'.'.join(str(x) for x in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors())
        print(f"error: invalid input: {errs}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # typer/click exits (usage errors already printed)
        return int(exc.code or 0)
    except Exception as exc:  # click usage errors surface as click exceptions
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            return 2
        if isinstance(exc, click.exceptions.Abort):
            print("aborted", file=sys.stderr)
            return 130
        raise
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())

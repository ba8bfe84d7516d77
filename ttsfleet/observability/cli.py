"""``ttsfleet dashboards ...``: build the chart's dashboards and rules, render PNG pictures."""

from __future__ import annotations

from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True)


@app.command()
def build(
    check: bool = typer.Option(False, "--check", help="exit 1 if the chart's files differ"),
    root: Path = typer.Option(None, help="repository root (default: this checkout)"),
    catalog: Path | None = typer.Option(
        None, "--catalog", help="GPU catalog file merged over the built-in classes (the run's, as "
                                "given to the operator): its classes' capacities go into the rules"),
) -> None:
    """Generate Grafana dashboards and Prometheus rules into charts/ttsfleet/."""
    from ttsfleet.catalog import GpuCatalog
    from ttsfleet.observability import build as b

    root = root or b.REPO_ROOT
    cat = GpuCatalog.load(catalog)
    if check:
        problems = b.check(root, cat)
        for p in problems:
            typer.echo(p, err=True)
        if problems:
            typer.echo("run `ttsfleet dashboards build` and commit the result", err=True)
            # SystemExit, not typer.Exit: the root CLI runs click with standalone_mode=False,
            # where typer.Exit's code is returned and dropped.
            raise SystemExit(1)
        typer.echo("dashboards and rules are up to date")
        return
    for path in b.write(root, cat):
        typer.echo(str(path))


@app.command()
def render(
    out: Path = typer.Option(None, help="folder for the PNG files (default: docs/dashboards/)"),
    workdir: Path = typer.Option(None, help="scratch folder (default: a temporary one)"),
) -> None:
    """Render each dashboard to a PNG from its real queries on a backfilled Prometheus (the demo
    fleet runs the built-in catalog's classes)."""
    from ttsfleet.catalog import GpuCatalog
    from ttsfleet.observability.build import REPO_ROOT
    from ttsfleet.observability.render import render_all

    for path in render_all(out or REPO_ROOT / "docs" / "dashboards", GpuCatalog.default(), workdir):
        typer.echo(str(path))

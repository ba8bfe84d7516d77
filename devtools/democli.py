"""``ttsfleet demo``: the whole loop on this machine, printed and plotted (:mod:`ttsfleet.devtools.loop`).

Needs what ``scripts/test.sh`` sets up: the local control plane's binaries
(``scripts/kube-local.sh build``), ``espeak-ng``, and the ``demo`` extra (Helm SDK, operator,
server, fill job). A missing piece is one line and exit 2 before anything starts.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shutil
import tempfile
import time
from pathlib import Path

import typer

from ttsfleet.errors import UserError


def preflight() -> None:
    """Refuse to start (one line) when a piece the demo needs is missing."""
    from ttsfleet.devtools.localkube import bin_dir, missing_binaries

    missing = missing_binaries()
    if missing:
        raise UserError(f"the local control plane is not built ({', '.join(missing)} missing in "
                        f"{bin_dir()}): run scripts/kube-local.sh build")
    if shutil.which("espeak-ng") is None:
        raise UserError("espeak-ng is not installed (apt-get install espeak-ng): the fill corpus needs it")
    for module, extra in (("helm_python", "demo"), ("kopf", "operator"), ("fastapi", "inference"),
                          ("soundfile", "fill")):
        if importlib.util.find_spec(module) is None:
            raise UserError(f"python package {module!r} is missing: pip install 'ttsfleet[{extra}]'")


def demo(
    out: Path = typer.Option(Path("ttsfleet-demo"), "--out", help="where the picture (demo.png) and the "
                             "record (demo.json) go"),
    workdir: Path = typer.Option(None, "--workdir", help="control plane, corpus, pod logs (default: a "
                                 "temporary directory, removed after the run unless --keep)"),
    keep: bool = typer.Option(False, "--keep", help="keep the work directory (pod logs, checkpoints)"),
    trace: Path = typer.Option(None, "--trace", help="traffic trace CSV (t, rate, mean_frames; "
                               "ttsfleet simulate's format); default: the demo's ramp up and down"),
    ttsdeployment: Path = typer.Option(None, "--ttsdeployment", help="the TTSDeployment manifest"),
    filljob: Path = typer.Option(None, "--filljob", help="the FillJob manifest"),
    seed: int = typer.Option(0, help="arrivals and corpus seed"),
    chart: Path = typer.Option(None, "--chart", help="the Helm chart (default: the checkout's "
                               "charts/ttsfleet, or ./charts/ttsfleet)"),
) -> None:
    """Run the loop on this machine: a real control plane, the chart's operator, real `ttsfleet serve`
    replicas and `ttsfleet fill run` shards as processes, an open-loop traffic trace against the
    Service; print and plot replicas, fill evictions, first audio and fill items. Cleans up."""
    preflight()
    from ttsfleet.devtools.loop import HERE, LoopConfig, find_chart, load_manifest, run_loop
    from ttsfleet.devtools.loopreport import plot, print_summary, summarize

    for p in (trace, ttsdeployment, filljob):
        if p is not None and not p.is_file():
            raise UserError(f"{p}: no such file")
    try:
        chart = find_chart(chart)
    except FileNotFoundError as exc:
        raise UserError(str(exc)) from None
    try:
        docs = {"ttsdeployment": load_manifest(ttsdeployment or HERE / "demo-ttsdeployment.yaml"),
                "filljob": load_manifest(filljob or HERE / "demo-filljob.yaml")}
    except ValueError as exc:
        raise UserError(str(exc)) from None
    tmp = None if workdir is not None else Path(tempfile.mkdtemp(prefix="ttsfleet-demo-"))
    work = workdir or tmp
    assert work is not None
    started = time.monotonic()
    cfg = LoopConfig(workdir=work, trace=trace or HERE / "demo-trace.csv", seed=seed, chart=chart,
                     log=lambda line: typer.echo(f"[{time.monotonic() - started:6.1f} s] {line}"), **docs)
    try:
        run = asyncio.run(run_loop(cfg))
    finally:
        if tmp is not None and not keep:
            shutil.rmtree(tmp, ignore_errors=True)
    record = run.to_dict()
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(record, indent=1, default=str))
    picture = plot(record, out / "demo.png")
    typer.echo("")
    print_summary(summarize(record), typer.echo)
    typer.echo(f"total {time.monotonic() - started:.0f} s; wrote {picture} and {out / 'demo.json'}"
               + (f"; work directory kept in {work}" if keep or workdir is not None else ""))


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)

"""``ttsfleet kernels ...`` commands: ``check`` (correctness on this device) and ``bench`` (H200 timing).

torch/triton are imported inside the commands so ``ttsfleet --help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ttsfleet.errors import UserError

app = typer.Typer(no_args_is_help=True)


@app.command()
def check(
    device: str = typer.Option("", help="cpu or cuda[:i]; default: cuda if available, else cpu."),
    quick: bool = typer.Option(False, help="Small shapes only (the default on CPU)."),
) -> None:
    """Run the correctness checks (odd shapes, poisoned outputs, float64 references) and print a table."""
    try:
        import torch
    except ImportError as exc:
        raise UserError("ttsfleet kernels check needs torch (pip install 'ttsfleet[inference]')") from exc
    from .check import format_table, run_checks

    if device and not (device == "cpu" or device.startswith("cuda")):
        raise UserError(f"unknown device {device!r}; use cpu or cuda[:i]")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError("CUDA was asked for but torch sees no GPU")
    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    results = run_checks(dev, quick=quick or dev == "cpu")
    typer.echo(format_table(results))
    failed = [r for r in results if not r.ok]
    if failed:
        typer.echo(f"{len(failed)} of {len(results)} checks FAILED", err=True)
        raise typer.Exit(1)
    typer.echo(f"all {len(results)} checks passed")


@app.command()
def bench(
    out: Path = typer.Option(Path("benchmarks/kernels"), help="Folder for the JSON, markdown and PNG."),
    ms: str = typer.Option("1,8,16,32,64,128", help="Comma-separated decode batch sizes M."),
    sweep: bool = typer.Option(False, help="Try several launch configs per shape and keep the fastest."),
    compile_mode: str = typer.Option("default", help="torch.compile mode for the compiled baselines."),
) -> None:
    """Time our kernels against cuBLAS/torch at the S2 Pro shapes with CUDA graphs (needs a Triton GPU).

    A Triton GPU: one whose GPU catalog class has kernel_backend triton (the H200 built in).
    """
    try:
        m_list = [int(v) for v in ms.split(",") if v.strip()]
    except ValueError as exc:
        raise UserError(f"--ms must be comma-separated integers, got {ms!r}") from exc
    if not m_list or min(m_list) < 1:
        raise UserError("--ms needs at least one positive batch size")
    try:
        import torch
    except ImportError as exc:
        raise UserError("ttsfleet kernels bench needs torch") from exc
    from . import dispatch

    if not torch.cuda.is_available() or not dispatch.plan("cuda").fused:
        raise UserError("ttsfleet kernels bench needs a GPU whose catalog class runs the Triton kernels "
                        "(H100/H200)")
    from .bench import run_bench

    run_bench(out, m_list, sweep=sweep, compile_mode=compile_mode)

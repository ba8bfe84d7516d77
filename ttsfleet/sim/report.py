"""Presenting simulation results: a side-by-side table and a PNG plot.

The headline is GPU-busy (what ``nvidia-smi`` / DCGM report), with allocated and load-weighted
beside it (:mod:`ttsfleet.sim.summary` defines all three).
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ttsfleet.sim.engine import SimResult
from ttsfleet.sim.summary import TARGET_GPU_BUSY

#: Short labels for the targets of :func:`ttsfleet.sim.summary.check_targets`.
TARGET_LABELS = {
    "gpu_busy_with_fill_ge_90pct": "target: ≥ 90% GPU-busy with fill",
    "p99_ttfa_within_slo": "target: p99 TTFA within SLO",
    "lost_fill_le_1pct": "target: fill lost ≤ 1%",
    "p99_ttfa_within_5pct_of_inference_only": "target: p99 TTFA ≤ inference-only +5%",
    "p99_ttfa_no_worse_than_inference_only": "target: p99 TTFA no worse than inference-only",
    "inference_only_busy_near_50pct": "target: inference-only ≈ 50% busy",
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def summary_table(runs: list[tuple[str, dict]], targets: dict[str, bool] | None = None) -> Table:
    """Rows of figures, one column per run (static-warm, inference-only, policy)."""
    table = Table(title="ttsfleet simulate", show_lines=False)
    table.add_column("metric")
    for name, _ in runs:
        table.add_column(name, justify="right")

    def row(label: str, fn) -> None:  # noqa: ANN001 - small local helper
        table.add_row(label, *[fn(s) for _, s in runs])

    o = lambda s: s["utilization"]["overall"]  # noqa: E731
    row("GPU-busy (NVML)", lambda s: _pct(o(s)["gpu_busy"]))
    for w in ("inference", "training", "fill"):
        row(f"  busy: {w}", lambda s, w=w: _pct(o(s)["gpu_busy_by"][w]))
    row("GPU allocated", lambda s: _pct(o(s)["allocated_busy"]))
    row("GPU load-weighted", lambda s: _pct(o(s)["load_weighted"]))
    for c in sorted(runs[0][1]["utilization"]["per_class"]):
        row(f"  {c}: busy / allocated",
            lambda s, c=c: f"{_pct(s['utilization']['per_class'][c]['gpu_busy'])} / "
                           f"{_pct(s['utilization']['per_class'][c]['allocated_busy'])}")
    row("TTFA p50 / p99 (ms)",
        lambda s: f"{s['inference']['ttfa_p50_ms']:.0f} / {s['inference']['ttfa_p99_ms']:.0f}")
    row("requests rejected (429)",
        lambda s: f"{s['inference']['rejected_429']} ({s['inference']['rejected_pct']:.2f}%)")
    row("SLO-violation minutes", lambda s: str(s["inference"]["slo_violation_minutes"]))
    row("scale events up / down",
        lambda s: f"{s['inference']['scale_events']['up']} / {s['inference']['scale_events']['down']}")
    row("fill GPU-hours done", lambda s: f"{s['fill']['gpu_hours_done']:.1f}")
    row("fill GPU-hours lost", lambda s: f"{s['fill']['gpu_hours_lost']:.2f} ({s['fill']['lost_pct']:.2f}%)")
    row("  restarts / stopping / abandoned / checkpoints",
        lambda s: " / ".join(f"{v:.2f}" for v in s["fill"]["lost_by_h"].values()))
    row("fill evictions (policy / scheduler)",
        lambda s: f"{s['fill']['evictions']} / {s['fill']['preemptions_by_scheduler']}")
    row("fill admissions / evictions per hour",
        lambda s: f"{s['fill']['admissions_per_h']:.1f} / {s['fill']['evictions_per_h']:.1f}")
    if any(s["fill"]["colocated"]["process_hours_held"] for _, s in runs):
        row("  co-located fill: running / yielded h, work GPU-h",
            lambda s: f"{s['fill']['colocated']['process_hours_held']:.1f} / "
                      f"{s['fill']['colocated']['yielded_h']:.1f}, "
                      f"{s['fill']['colocated']['work_gpu_hours']:.1f}")
        row("  shared instead of evicted / GPU handed back",
            lambda s: f"{s['fill']['colocated']['shared']} / {s['fill']['colocated']['unshared']}")
    row("training GPU-h (jobs, mean wait s)",
        lambda s: f"{s['training']['gpu_hours']:.1f} ({s['training']['jobs_started']}, "
                  f"{s['training']['mean_wait_s']:.0f})")
    if targets:
        for k, v in targets.items():
            mark = "[green]met[/green]" if v else "[red]missed[/red]"
            table.add_row(TARGET_LABELS.get(k, f"target: {k}"), *([""] * (len(runs) - 1)), mark)
    return table


def print_report(runs: list[tuple[str, dict]], targets: dict[str, bool] | None,
                 console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(runs, targets))


def plot(results: list[tuple[str, SimResult]], path: str | Path) -> Path:
    """Allocation stack, GPU-busy share, replicas and traffic over time, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    path = Path(path)
    main_name, main = results[-1]
    s = main.minute_series
    hours = np.arange(len(s["rate"])) / 60.0
    total = sum(main.scenario.fleet.values())
    fig, axes = plt.subplots(4, 1, figsize=(12, 11), sharex=True,
                             gridspec_kw={"height_ratios": [3, 2, 2, 1.5]})
    ax = axes[0]
    stack = [s["alloc_inference"], s["alloc_training"], s["alloc_fill"], s["alloc_idle"]]
    ax.stackplot(hours, *[x / total for x in stack], labels=["inference", "training", "fill", "idle"],
                 colors=["#3b75af", "#8c6bb1", "#5aa469", "#dddddd"], alpha=0.9)
    ax.set_ylabel("GPU share (allocated)")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower left", ncol=4, fontsize=8)
    ax.set_title(f"{main_name}: GPUs allocated by workload ({total} GPUs)")
    ax = axes[1]
    for name, r in results:
        ax.plot(hours, r.minute_series["busy"] / total, lw=1, label=f"GPU-busy, {name}")
    ax.axhline(TARGET_GPU_BUSY, color="k", ls="--", lw=1, label=f"{TARGET_GPU_BUSY:.0%} target")
    ax.set_ylabel("GPU-busy share (NVML)")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower left", fontsize=8)
    ax = axes[2]
    pools = [k for k in s if k.startswith("replicas_")]
    for key, style in zip(pools, ("-", "--", ":", "-."), strict=False):
        ax.plot(hours, s[key], lw=1, ls=style, label=key.removeprefix("replicas_"))
    ax.set_ylabel("ready replicas")
    ax.legend(loc="upper left", fontsize=8)
    ax = axes[3]
    ax.plot(hours, s["rate"], lw=0.8, color="#b5523b")
    ax.set_ylabel("requests/s")
    ax.set_xlabel("hours")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

"""Presenting simulation results: a side-by-side table and a PNG plot.

Utilization is always shown three ways and never one as another:

* allocated — GPU-time held by a workload (a pod or job has the GPU, whatever it is doing);
* active — GPU-time with work running: an inference replica with at least one request in flight,
  a fill or training job while it runs (what ``nvidia-smi`` utilization shows);
* load-weighted — work done over capacity: inference frames decoded over what the GPUs could
  decode at their peak, plus fill and training GPU-time scaled by how hard they load the GPU.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ttsfleet.sim.engine import SimResult

TARGET_ACTIVE = 0.92

#: Short labels for the targets of :func:`ttsfleet.sim.engine.check_targets`.
TARGET_LABELS = {
    "active_with_fill_ge_92pct": "target: ≥ 92% active",
    "lost_fill_le_1pct": "target: fill lost ≤ 1%",
    "p99_ttfa_within_5pct_of_baseline": "target: p99 TTFA ≤ base +5%",
    "baseline_active_near_50pct": "target: baseline ≈ 50%",
}


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def summary_table(runs: list[tuple[str, dict]], targets: dict[str, bool | None] | None = None) -> Table:
    """Rows of figures, one column per run (e.g. inference-only vs policy)."""
    table = Table(title="ttsfleet simulate", show_lines=False)
    table.add_column("metric")
    for name, _ in runs:
        table.add_column(name, justify="right")

    def row(label: str, fn) -> None:  # noqa: ANN001 - small local helper
        table.add_row(label, *[fn(s) for _, s in runs])

    o = lambda s: s["utilization"]["overall"]  # noqa: E731
    row("GPU utilization, active", lambda s: _pct(o(s)["active_total"]))
    row("  active: inference", lambda s: _pct(o(s)["active"]["inference"]))
    row("  active: training", lambda s: _pct(o(s)["active"]["training"]))
    row("  active: fill", lambda s: _pct(o(s)["active"]["fill"]))
    row("GPU utilization, allocated", lambda s: _pct(o(s)["allocated_busy"]))
    row("GPU utilization, load-weighted", lambda s: _pct(o(s)["load_weighted"]))
    classes = sorted(runs[0][1]["utilization"]["per_class"])
    for c in classes:
        row(f"  {c}: active / allocated",
            lambda s, c=c: f"{_pct(s['utilization']['per_class'][c]['active_total'])} / "
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
    row("fill preemptions", lambda s: str(s["fill"]["evictions"]))
    row("training GPU-h (mean wait s)",
        lambda s: f"{s['training']['gpu_hours']:.1f} ({s['training']['mean_wait_s']:.0f})")
    if targets:
        for k, v in targets.items():
            mark = "n/a" if v is None else ("[green]met[/green]" if v else "[red]missed[/red]")
            table.add_row(TARGET_LABELS.get(k, f"target: {k}"), *([""] * (len(runs) - 1)), mark)
    return table


def print_report(runs: list[tuple[str, dict]], targets: dict[str, bool | None] | None,
                 console: Console | None = None) -> None:
    console = console or Console()
    console.print(summary_table(runs, targets))


def plot(results: list[tuple[str, SimResult]], path: str | Path) -> Path:
    """Utilization stack, active fraction, replicas and traffic over time, as a PNG."""
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
    ax.axhline(TARGET_ACTIVE, color="k", ls="--", lw=1, label="92% target")
    ax.set_ylabel("GPU share (allocated)")
    ax.set_ylim(0, 1)
    ax.legend(loc="lower left", ncol=5, fontsize=8)
    ax.set_title(f"{main_name}: GPUs allocated by workload ({total} GPUs)")
    ax = axes[1]
    for name, r in results:
        ax.plot(hours, r.minute_series["active_frac"], lw=1, label=f"active, {name}")
    ax.axhline(TARGET_ACTIVE, color="k", ls="--", lw=1)
    ax.set_ylabel("active GPU share")
    ax.set_ylim(0, 1.02)
    ax.legend(loc="lower left", fontsize=8)
    ax = axes[2]
    for key, arr in s.items():
        if key.startswith("replicas_"):
            ax.plot(hours, arr, lw=1, label=key.removeprefix("replicas_"))
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

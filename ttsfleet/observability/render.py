"""Pictures of the dashboards, drawn with matplotlib from the dashboards' own queries.

No Grafana server runs here, so ``ttsfleet dashboards render`` backfills the demo fleet into a
real Prometheus, runs every panel's query (range queries for time series, instant queries for
stats) with template variables set to *All*, and lays the panels out on Grafana's 24-column grid.
The README shows these pictures; they come from the same PromQL the chart ships.
"""

from __future__ import annotations

import re
import tempfile
import time
from pathlib import Path
from typing import Any

from ttsfleet.catalog import GpuCatalog
from ttsfleet.devtools.promserver import Prometheus, backfill
from ttsfleet.observability.model import Dashboard, Panel, Placed, layout

ALL = {"namespace": ".*", "deployment": ".*", "gpu_class": ".*"}
STEP_S = 60
COLORS = ["#7EB26D", "#EAB839", "#6ED0E0", "#EF843C", "#E24D42", "#1F78C1", "#BA43A9", "#705DA0",
          "#508642", "#CCA300"]


def substitute(expr: str, range_s: int) -> str:
    """Grafana's substitution with every variable on All (``.*``)."""
    expr = expr.replace("$__rate_interval", f"{4 * 15}s").replace("$__range", f"{range_s}s")
    return re.sub(r"\$([A-Za-z_]\w*)", lambda m: ALL[m.group(1)], expr)  # not label_replace's $1


def legend(fmt: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def _fmt(v: float, unit: str) -> str:
    if unit == "percentunit":
        return f"{v:.1%}"
    if unit == "percent":
        return f"{v:.1f}%"
    if unit == "s":  # sub-10 ms values keep their tenths (a 0.3 ms GIL wait, not "0 ms")
        if v >= 1:
            return f"{v:.1f} s"
        return f"{v * 1000:.0f} ms" if v >= 0.01 or v == 0 else f"{v * 1000:.1f} ms"
    if unit == "reqps":
        return f"{v:.2f} req/s"
    return f"{v:.3g}"


def _timeseries(ax: Any, p: Panel, prom: Prometheus, start: float, end: float) -> None:
    import matplotlib.dates as mdates
    import numpy as np

    series: list[tuple[str, list[float], list[float]]] = []
    for t in p.targets:
        for r in prom.query_range(substitute(t.expr, int(end - start)), start, end, STEP_S):
            xs, ys = zip(*r["values"], strict=True)
            series.append((legend(t.legend, r["metric"]), list(xs), list(ys)))
    series.sort(key=lambda s: s[0])
    if not series:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes, color="#999")
        return
    import datetime as dt

    conv = lambda xs: [dt.datetime.fromtimestamp(x, dt.UTC) for x in xs]  # noqa: E731
    if p.stacked:
        grid = np.arange(start, end + 1, STEP_S)
        ys = [np.interp(grid, xs, vs, left=0, right=0) for _, xs, vs in series]
        ax.stackplot(conv(grid), *ys, labels=[s[0] for s in series], colors=COLORS, alpha=0.75)
    else:
        for i, (name, xs, vs) in enumerate(series):
            ax.plot(conv(xs), vs, label=name, color=COLORS[i % len(COLORS)], lw=1.6)
    for th in p.thresholds:
        ax.axhline(th, color="#E24D42", ls="--", lw=1.2)
    if p.min is not None:
        ax.set_ylim(bottom=p.min)
    if p.max is not None:
        ax.set_ylim(top=p.max * 1.05)
    ax.yaxis.set_major_formatter(lambda v, _pos: _fmt(v, p.unit))
    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M", tz=dt.UTC))
    ax.tick_params(labelsize=7, colors="#ccc")
    ax.grid(alpha=0.15)
    ax.legend(fontsize=6, loc="upper left", ncol=3 if len(series) > 3 else 1, framealpha=0.3,
              labelcolor="#ddd", facecolor="#222")


def _stat(ax: Any, p: Panel, prom: Prometheus, start: float, end: float) -> None:
    values: list[tuple[str, float]] = []
    for t in p.targets:
        for r in prom.query(substitute(t.expr, int(end - start)), end):
            values.append((legend(t.legend, r["metric"]), r["value"]))
    ax.set_axis_off()
    if not values:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", color="#999")
        return
    for i, (name, v) in enumerate(values):
        good = (v >= p.thresholds[0]) == p.higher_is_better if p.thresholds else True
        color = "#73BF69" if good else "#F2495C"
        y = 0.5 if len(values) == 1 else 0.85 - i * 0.8 / max(len(values), 1)
        if len(values) == 1:
            ax.text(0.5, y, _fmt(v, p.unit), ha="center", va="center", fontsize=26, color=color,
                    weight="bold")
        else:
            ax.text(0.05, y, name, ha="left", va="center", fontsize=9, color="#ddd")
            ax.text(0.95, y, _fmt(v, p.unit), ha="right", va="center", fontsize=14, color=color,
                    weight="bold")


def render_dashboard(dash: Dashboard, prom: Prometheus, start: float, end: float, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    placed: list[Placed] = layout(dash)
    rows = max(p.y + p.h for p in placed)
    unit = 0.42  # inches per grid row
    fig = plt.figure(figsize=(16, rows * unit + 0.8), facecolor="#111217")
    height = rows * unit + 0.8
    fig.text(0.01, 1 - 0.3 / height, dash.title, fontsize=14, color="white", weight="bold", va="center")
    fig.text(0.99, 1 - 0.3 / height, "demo fleet, rendered from the shipped PromQL on a real Prometheus",
             fontsize=8, color="#888", ha="right", va="center")
    top = 1 - 0.6 / height
    for pl in placed:
        x0, w = pl.x / 24, pl.w / 24
        y0 = top - (pl.y + pl.h) * unit / height
        if pl.panel is None:
            fig.text(x0 + 0.005, y0 + 0.5 * unit / height, pl.row.title, fontsize=11, color="#ccc",
                     weight="bold", va="center")
            continue
        pad = 0.04 if pl.panel.kind == "timeseries" else 0.005  # room for y tick labels
        ax = fig.add_axes((x0 + pad, y0 + 0.35 * unit / height, w - pad - 0.008,
                           (pl.h - 1.1) * unit / height))
        ax.set_facecolor("#181b1f")
        for s in ax.spines.values():
            s.set_color("#333")
        ax.set_title(pl.panel.title, fontsize=9, color="#ddd", loc="left")
        if pl.panel.kind == "stat":
            _stat(ax, pl.panel, prom, start, end)
        else:
            _timeseries(ax, pl.panel, prom, start, end)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, facecolor=fig.get_facecolor())
    plt.close(fig)
    return path


def render_all(out: Path, catalog: GpuCatalog, workdir: Path | None = None) -> list[Path]:
    """Backfill the demo fleet, start Prometheus, draw every dashboard into ``out``."""
    from ttsfleet.observability.definitions import all_dashboards
    from ttsfleet.observability.demo import generate

    start = (int(time.time()) // 3600 - 4) * 3600
    data = generate(start)
    with tempfile.TemporaryDirectory() as tmp:
        work = workdir or Path(tmp)
        with Prometheus(backfill(data.openmetrics, work)) as prom:
            return [render_dashboard(d, prom, data.start, data.end, out / f"{d.uid}.png")
                    for d in all_dashboards(catalog)]

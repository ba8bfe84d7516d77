"""Dashboards as plain data: panels, targets, rows and template variables.

The Grafana JSON (via grafana-foundation-sdk), the matplotlib pictures and the tests all read the
same :class:`Dashboard` objects, so a query cannot appear in one and differ in another. Nothing
here imports the SDK; grid positions are computed once, here, by :func:`layout`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

PanelKind = Literal["timeseries", "stat"]

#: Grafana's dashboard grid is 24 columns wide.
GRID_WIDTH = 24


@dataclass(frozen=True)
class Target:
    """One PromQL query of a panel and the legend its series get."""

    expr: str
    legend: str


@dataclass(frozen=True)
class Panel:
    """One panel: a title, its queries and how they are shown."""

    title: str
    kind: PanelKind
    targets: tuple[Target, ...]
    description: str
    unit: str = "short"
    width: int = 12
    height: int = 8
    #: Horizontal lines (timeseries) or colour steps (stat), e.g. the 90 % target or the SLO.
    thresholds: tuple[float, ...] = ()
    #: Stat panels: values above the threshold are good (green) rather than bad (red).
    higher_is_better: bool = True
    stacked: bool = False
    min: float | None = None
    max: float | None = None


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A template variable. ``kind='datasource'`` picks a Prometheus; ``'query'`` lists label values."""

    name: str
    label: str
    kind: Literal["datasource", "query"]
    query: str = ""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = field(default=("ttsfleet",))

    def panels(self) -> list[Panel]:
        return [p for r in self.rows for p in r.panels]


@dataclass(frozen=True)
class Placed:
    """A panel or row with its id and grid position (x, y, w, h)."""

    id: int
    x: int
    y: int
    w: int
    h: int
    panel: Panel | None  # None for a row header
    row: Row


def layout(dash: Dashboard) -> list[Placed]:
    """Ids and grid positions, top to bottom: a row header, then its panels left to right."""
    out: list[Placed] = []
    pid, y = 1, 0
    for row in dash.rows:
        out.append(Placed(pid, 0, y, GRID_WIDTH, 1, None, row))
        pid += 1
        y += 1
        x, line_h = 0, 0
        for p in row.panels:
            if p.width > GRID_WIDTH:
                raise ValueError(f"panel {p.title!r} is wider than the grid")
            if x + p.width > GRID_WIDTH:
                x, y, line_h = 0, y + line_h, 0
            out.append(Placed(pid, x, y, p.width, p.height, p, row))
            pid += 1
            x += p.width
            line_h = max(line_h, p.height)
        y += line_h
    return out

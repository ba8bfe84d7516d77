"""Turn :mod:`ttsfleet.observability.definitions` into Grafana dashboard JSON.

Uses grafana-foundation-sdk (pinned ``1769699379!11.6.0``; imported inside the functions so the
CLI starts without it). The SDK does not assign panel ids, so ids and grid positions come from
:func:`ttsfleet.observability.model.layout`. Every panel, query and query variable points at the
``$datasource`` variable.
"""

from __future__ import annotations

import json
from typing import Any

from ttsfleet.observability.model import Dashboard, Panel, Variable, layout

DS_UID = "${datasource}"


def _ds() -> Any:
    from grafana_foundation_sdk.models.dashboard import DataSourceRef

    return DataSourceRef(type_val="prometheus", uid=DS_UID)


def _variable(v: Variable) -> Any:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models.dashboard import VariableRefresh, VariableSort

    if v.kind == "datasource":
        return db.DatasourceVariable(v.name).label(v.label).type(v.query)
    return (db.QueryVariable(v.name).label(v.label).datasource(_ds())
            .query({"query": v.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"})
            .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED).sort(VariableSort.ALPHABETICAL_ASC)
            .multi(True).include_all(True).all_value(".*"))


def _thresholds(p: Panel) -> Any:
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.models.dashboard import Threshold, ThresholdsMode

    below, above = ("red", "green") if p.higher_is_better else ("green", "red")
    if p.kind == "timeseries":
        below, above = "green", "red"
    steps = [Threshold(value=None, color=below)] + [Threshold(value=t, color=above)
                                                    for t in p.thresholds]
    return db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps)


def _panel(p: Panel, pid: int, x: int, y: int) -> Any:
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import prometheus, stat, timeseries
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models.dashboard import GridPos

    if p.kind == "stat":
        b = (stat.Panel().graph_mode(common.BigValueGraphMode.NONE)
             .color_mode(common.BigValueColorMode.VALUE)
             .reduce_options(cb.ReduceDataOptions().calcs(["lastNotNull"])))
    else:
        b = (timeseries.Panel().line_width(2).fill_opacity(25 if p.stacked else 8)
             .legend(cb.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                     .placement(common.LegendPlacement.BOTTOM).show_legend(True))
             .stacking(cb.StackingConfig().mode(common.StackingMode.NORMAL if p.stacked
                                                else common.StackingMode.NONE)))
        if p.thresholds:
            b = b.thresholds_style(cb.GraphThresholdsStyleConfig()
                                   .mode(common.GraphThresholdsStyleMode.LINE))
    b = (b.id(pid).title(p.title).description(p.description).datasource(_ds()).unit(p.unit)
         .grid_pos(GridPos(h=p.height, w=p.width, x=x, y=y)).thresholds(_thresholds(p)))
    if p.min is not None:
        b = b.min(p.min)
    if p.max is not None:
        b = b.max(p.max)
    for i, t in enumerate(p.targets):
        q = (prometheus.Dataquery().expr(t.expr).legend_format(t.legend)
             .ref_id(chr(ord("A") + i)).datasource(_ds()))
        b = b.with_target(q.instant() if p.kind == "stat" else q.range())
    return b


def build(dash: Dashboard) -> dict[str, Any]:
    """The Grafana JSON model of ``dash`` as a plain dict."""
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import DashboardCursorSync, GridPos

    b = (db.Dashboard(dash.title).uid(dash.uid).description(dash.description).tags(list(dash.tags))
         .editable().tooltip(DashboardCursorSync.CROSSHAIR).time("now-3h", "now").refresh("1m")
         .timezone("utc"))
    for v in dash.variables:
        b = b.with_variable(_variable(v))
    for placed in layout(dash):
        if placed.panel is None:
            b = b.with_row(db.Row(placed.row.title).id(placed.id)
                           .grid_pos(GridPos(h=1, w=placed.w, x=0, y=placed.y)))
        else:
            b = b.with_panel(_panel(placed.panel, placed.id, placed.x, placed.y))
    return json.loads(json.dumps(b.build(), cls=JSONEncoder))


def render_json(dash: Dashboard) -> str:
    """Stable text for the chart: sorted keys, two-space indent, trailing newline."""
    return json.dumps(build(dash), indent=2, sort_keys=True) + "\n"

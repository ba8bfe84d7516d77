"""Prometheus recording rules and alerts for the fleet, written as a plain rules file.

Recording rules use the same PromQL builders as the dashboards (:mod:`figures`), so a recorded
figure and a panel cannot disagree. Alerts:

* TTFA SLO burn (multi-window, multi-burn-rate: 14.4x over 1 h and 5 m pages, 6x over 6 h and
  30 m tickets; the error budget is 1 - objective).
* Fill starvation: a GPU class with idle GPUs and no fill pod admitted for 15 minutes.
* A fill job not checkpointing for ``CHECKPOINT_INTERVALS_LATE`` checkpoint intervals.
* Fill work lost (any increase of ``fill_items_lost``).
* A fill eviction stuck past its grace period.
* Inference pods not ready (ready below desired per pool for 10 minutes).
* Fleet utilization below the 90 % target for 2 hours, and the Slurm exporter failing.
* A Slurm fill shard stalled (its job died without finishing it and no job carries it) for 15 m.

The chart engineer wraps :func:`render_yaml`'s output in a PrometheusRule.
"""

from __future__ import annotations

from typing import Any

import yaml

from ttsfleet.catalog import GpuCatalog
from ttsfleet.observability import figures as fg

FAST_BURN, SLOW_BURN = 14.4, 6.0
SLO_WINDOWS = ("5m", "30m", "1h", "6h")


def _rec(record: str, expr: str) -> dict[str, Any]:
    return {"record": record, "expr": expr}


def _alert(name: str, expr: str, for_: str, severity: str, summary: str, description: str) -> dict[str, Any]:
    return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
            "annotations": {"summary": summary, "description": description}}


def recording_rules(catalog: GpuCatalog) -> list[dict[str, Any]]:
    return [
        _rec("ttsfleet:gpus_total:sum", fg.gpus_total()),
        _rec("ttsfleet:gpus_allocated:sum", fg.gpus_allocated()),
        _rec("ttsfleet:gpus_active:sum", fg.gpus_active()),
        _rec("ttsfleet:gpus_load_weighted:sum", fg.gpus_load_weighted("5m", catalog)),
        _rec("ttsfleet:gpu_utilization_allocated:ratio", fg.ratio_by_class(fg.gpus_allocated())),
        _rec("ttsfleet:gpu_utilization_active:ratio", fg.ratio_by_class(fg.gpus_active())),
        _rec("ttsfleet:gpu_utilization_load_weighted:ratio",
             fg.ratio_by_class(fg.gpus_load_weighted("5m", catalog))),
        _rec("ttsfleet:fleet_gpu_utilization_allocated:ratio", fg.ratio_fleet(fg.gpus_allocated())),
        _rec("ttsfleet:fleet_gpu_utilization_active:ratio", fg.ratio_fleet(fg.gpus_active())),
        _rec("ttsfleet:fleet_gpu_utilization_load_weighted:ratio",
             fg.ratio_fleet(fg.gpus_load_weighted("5m", catalog))),
        _rec("ttsfleet:inference_frames:rate5m", fg.inference_frames_rate("5m")),
        _rec("ttsfleet:inference_load:ratio_rate5m", fg.inference_load("5m", catalog)),
    ]


def slo_rules() -> list[dict[str, Any]]:
    return [_rec(f"ttsfleet:inference_ttfa_good:ratio_rate{w}", fg.ttfa_good_ratio(w))
            for w in SLO_WINDOWS]


def _burn(window: str, factor: float) -> str:
    budget = round(1 - fg.TTFA_OBJECTIVE, 6)
    return f"(1 - ttsfleet:inference_ttfa_good:ratio_rate{window}) > ({factor:g} * {budget:g})"


def alerts() -> list[dict[str, Any]]:
    slo, late = fg.TTFA_SLO_S, fg.CHECKPOINT_LATE_S
    return [
        _alert("TTSFleetTTFABudgetBurnFast", f"{_burn('1h', FAST_BURN)} and {_burn('5m', FAST_BURN)}",
               "2m", "page", "Time-to-first-audio SLO budget burning fast",
               f"{{{{ $labels.namespace }}}}/{{{{ $labels.deployment }}}}: more than {FAST_BURN:g}x "
               f"the error budget of requests over {slo:g} s TTFA in the last hour."),
        _alert("TTSFleetTTFABudgetBurnSlow", f"{_burn('6h', SLOW_BURN)} and {_burn('30m', SLOW_BURN)}",
               "15m", "ticket", "Time-to-first-audio SLO budget burning",
               f"{{{{ $labels.namespace }}}}/{{{{ $labels.deployment }}}}: more than {SLOW_BURN:g}x "
               f"the error budget of requests over {slo:g} s TTFA in the last 6 hours."),
        _alert("TTSFleetFillStarved",
               'sum by (gpu_class) (ttsfleet_gpus{workload="idle"}) >= 1 unless on (gpu_class) '
               "sum by (gpu_class) (increase(ttsfleet_operator_fill_admissions_total[15m])) > 0",
               "15m", "warning", "GPUs idle while no fill work is admitted",
               "{{ $value }} {{ $labels.gpu_class }} GPUs are idle and no fill pod was admitted "
               "on that class for 15 minutes: the fill queue is empty or admission is broken."),
        _alert("TTSFleetFillNotCheckpointing",
               f"time() - ttsfleet_fill_last_checkpoint_timestamp_seconds > {late:g}",
               "5m", "warning", "Fill job not checkpointing",
               f"Fill job {{{{ $labels.fill_job }}}} has not checkpointed for over {late:g} s; "
               "a preemption now loses that work."),
        _alert("TTSFleetFillWorkLost", "increase(ttsfleet_fill_items_lost_total[1h]) > 0",
               "0m", "critical", "Fill work lost or duplicated",
               "Fill job {{ $labels.fill_job }} lost or duplicated committed items; the "
               "checkpoint/commit protocol is broken."),
        _alert("TTSFleetFillEvictionStuck", "ttsfleet_operator_eviction_stuck > 0",
               "2m", "warning", "Fill eviction stuck past its grace period",
               "{{ $value }} fill pods on {{ $labels.gpu_class }} are still terminating past their "
               "grace period; inference capacity is blocked."),
        _alert("TTSFleetInferencePodsNotReady",
               "sum by (namespace, deployment, pool) (ttsfleet_operator_replicas_ready) < "
               "sum by (namespace, deployment, pool) (ttsfleet_operator_replicas_desired)",
               "10m", "warning", "Inference replicas not ready",
               "{{ $labels.namespace }}/{{ $labels.deployment }} pool {{ $labels.pool }} has fewer "
               "ready replicas than desired for 10 minutes."),
        _alert("TTSFleetUtilizationBelowTarget",
               f"ttsfleet:fleet_gpu_utilization_allocated:ratio < {fg.UTILIZATION_TARGET:g}",
               "2h", "info", "Fleet GPU allocation below target",
               f"Allocated GPU utilization is {{{{ $value | humanizePercentage }}}}, below the "
               f"{fg.UTILIZATION_TARGET:.0%} target, for 2 hours."),
        _alert("TTSFleetSlurmExporterDown", "ttsfleet_slurm_up == 0", "5m", "warning",
               "Slurm exporter cannot query Slurm",
               "The Slurm exporter's last queries failed; Slurm panels and fill decisions are blind."),
        _alert("TTSFleetFillShardStalled", "max by (dataset) (ttsfleet_slurm_fill_shards_stalled) > 0",
               "15m", "warning", "Slurm fill shards stalled",
               "{{ $value }} shard(s) of fill dataset {{ $labels.dataset }} ended without finishing "
               "(SIGKILL/OOM, full disk, unreadable checkpoint) and have not run again for 15 minutes; "
               "`ttsfleet slurm fill-agent` shows why."),
    ]


def rule_groups(catalog: GpuCatalog) -> dict[str, Any]:
    return {"groups": [
        {"name": "ttsfleet-utilization", "interval": "30s", "rules": recording_rules(catalog)},
        {"name": "ttsfleet-slo", "interval": "30s", "rules": slo_rules()},
        {"name": "ttsfleet-alerts", "rules": alerts()},
    ]}


def render_yaml(catalog: GpuCatalog) -> str:
    header = ("# Generated by `ttsfleet dashboards build` from ttsfleet/observability/rules.py.\n"
              "# Do not edit; change the code and rebuild.\n")
    return header + yaml.safe_dump(rule_groups(catalog), sort_keys=False, width=100)

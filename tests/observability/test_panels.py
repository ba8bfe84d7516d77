"""Every panel query, with template variables substituted, returns the expected data.

The demo fleet (``ttsfleet.observability.demo``) drives the project's own collectors; its
scrapes are backfilled into a real Prometheus and every target of every dashboard is queried at
the end of the demo. The expected result of each target is computed here, independently of
PromQL, from the samples the demo wrote (a small oracle implementing rate/increase
extrapolation and bucket interpolation the way Prometheus 2.x documents them).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Callable

import pytest

from ttsfleet.catalog import GpuCatalog
from ttsfleet.observability import demo as dm
from ttsfleet.observability import figures as fg
from ttsfleet.observability.definitions import all_dashboards

CAT = GpuCatalog.default()

Vec = dict[frozenset[tuple[str, str]], float]
RATE_INTERVAL, RANGE = 60, 3 * 3600
LOOKBACK = 300


def substitute(expr: str, values: dict[str, str] | None = None) -> str:
    """Grafana's variable substitution for the values the tests use (All = ``.*``)."""
    values = {"namespace": ".*", "deployment": ".*", "gpu_class": ".*", **(values or {})}
    expr = expr.replace("$__rate_interval", f"{RATE_INTERVAL}s").replace("$__range", f"{RANGE}s")
    # $1 (a label_replace capture) is no variable: Grafana leaves names it does not know alone.
    expr = re.sub(r"\$([A-Za-z_]\w*)", lambda m: values[m.group(1)], expr)
    assert not re.search(r"\$[A-Za-z_]", expr)
    return expr


# ---- oracle -----------------------------------------------------------------------------------
class Oracle:
    def __init__(self, data: dm.DemoData, at: float) -> None:
        self.data, self.t = data, at

    def _series(self, name: str, match: Callable[[dict[str, str]], bool]) -> dict:
        return {k: v for k, v in self.data.samples.items() if k[0] == name and match(dict(k[1]))}

    def last(self, name: str, match: Callable[[dict[str, str]], bool] = lambda _: True) -> Vec:
        out: Vec = {}
        for (_, labels), pts in self._series(name, match).items():
            inside = [v for t, v in pts if self.t - LOOKBACK < t <= self.t]
            if inside:
                out[frozenset(labels)] = inside[-1]
        return out

    def increase(self, name: str, window: float, match: Callable[[dict[str, str]], bool] = lambda _: True,
                 per_second: bool = False) -> Vec:
        """Prometheus 2.x extrapolatedRate over the closed window [t - window, t]."""
        out: Vec = {}
        lo = self.t - window
        for (_, labels), pts in self._series(name, match).items():
            w = [(t, v) for t, v in pts if lo <= t <= self.t]
            if len(w) < 2:
                continue
            delta = w[-1][1] - w[0][1]
            delta += sum(a[1] for a, b in zip(w, w[1:], strict=False) if b[1] < a[1])  # resets
            sampled = w[-1][0] - w[0][0]
            avg = sampled / (len(w) - 1)
            to_start, to_end = w[0][0] - lo, self.t - w[-1][0]
            if delta > 0 and w[0][1] >= 0:
                to_start = min(to_start, sampled * (w[0][1] / delta))
            ext = sampled + (to_start if to_start < avg * 1.1 else avg / 2)
            ext += to_end if to_end < avg * 1.1 else avg / 2
            val = delta * ext / sampled
            out[frozenset(labels)] = val / window if per_second else val
        return out

    def rate(self, name: str, window: float, match: Callable[[dict[str, str]], bool] = lambda _: True) -> Vec:
        return self.increase(name, window, match, per_second=True)


def by(vec: Vec, *labels: str) -> Vec:
    out: dict[frozenset[tuple[str, str]], float] = defaultdict(float)
    for k, v in vec.items():
        d = dict(k)
        out[frozenset((lb, d[lb]) for lb in labels if lb in d)] += v
    return dict(out)


def total(vec: Vec) -> float:
    return sum(vec.values())


def quantile(q: float, buckets: Vec) -> float:
    """Prometheus bucketQuantile over one set of cumulative buckets keyed by ``le``."""
    bs = sorted(((math.inf if dict(k)["le"] == "+Inf" else float(dict(k)["le"])), v)
                for k, v in buckets.items())
    rank = q * bs[-1][1]
    for i, (le, cum) in enumerate(bs):
        if cum >= rank:
            if math.isinf(le):
                return bs[i - 1][0]
            lower, prev = (0.0, 0.0) if i == 0 else bs[i - 1]
            return lower + (le - lower) * (rank - prev) / (cum - prev)
    raise AssertionError("no bucket reaches the rank")


def one(v: float) -> Vec:
    return {frozenset(): v}


# ---- expected values per (dashboard uid, panel title, target legend) ----------------------
def expectations(o: Oracle) -> dict[tuple[str, str, str], Vec]:
    cat = GpuCatalog.default()
    W = RATE_INTERVAL
    not_idle = lambda lb: lb["workload"] != "idle"  # noqa: E731
    pod_class = {p.name: p.gpu_class for p in dm.PODS}
    gpus_total = by(o.last("ttsfleet_gpus_total"), "gpu_class")
    alloc = by(o.last("ttsfleet_gpus", not_idle), "gpu_class")
    active = by(o.last("ttsfleet_gpus_active", not_idle), "gpu_class")
    frames = o.rate("ttsfleet_inference_frames_total", W)
    frames_by_class: dict = defaultdict(float)
    for k, v in frames.items():
        frames_by_class[pod_class[dict(k)["pod"]]] += v
    jobs = by(o.last("ttsfleet_gpus_active", lambda lb: lb["workload"] in ("fill", "training")),
              "gpu_class")
    load: Vec = {}
    for k in gpus_total:
        gc = dict(k)["gpu_class"]
        load[k] = frames_by_class.get(gc, 0.0) / cat.get(gc).capacity.peak_frames_per_s + jobs.get(k, 0.0)
    ratio = lambda num: {k: num.get(k, 0.0) / gpus_total[k] for k in gpus_total}  # noqa: E731

    def ttfa_buckets(metric: str) -> Vec:
        return by(o.rate(metric + "_bucket", W), "le")

    inf_load: Vec = {}
    for k, v in frames.items():
        d = dict(k)
        ready = sum(r for kk, r in o.last("ttsfleet_inference_ready").items()
                    if pod_class[dict(kk)["pod"]] == pod_class[d["pod"]])
        key = frozenset({"namespace": d["namespace"], "deployment": d["deployment"],
                         "gpu_class": pod_class[d["pod"]]}.items())
        inf_load[key] = inf_load.get(key, 0.0) + v / (ready * cat.get(pod_class[d["pod"]])
                                                       .capacity.peak_frames_per_s)
    slo_le = fg.le_label(fg.TTFA_SLO_S)
    good = by(o.rate("ttsfleet_inference_ttfa_seconds_bucket", W, lambda lb: lb["le"] == slo_le),
              "namespace", "deployment")
    count = by(o.rate("ttsfleet_inference_ttfa_seconds_count", W), "namespace", "deployment")
    bsum, bcount = (total(o.rate(f"ttsfleet_inference_batch_size_{s}", W)) for s in ("sum", "count"))
    ttfa_mean = (total(o.rate("ttsfleet_inference_ttfa_seconds_sum", W))
                 / total(o.rate("ttsfleet_inference_ttfa_seconds_count", W)))
    by_stage = {frozenset({("stage", st)}): share * ttfa_mean for st, share in dm.TTFA_STAGE_SHARES}
    by_phase = {k: v / bcount for k, v in by(o.rate("ttsfleet_inference_engine_seconds_total", W),
                                              "phase").items()}
    by_work = {k: v / bcount for k, v in by(o.rate("ttsfleet_inference_engine_gpu_seconds_total", W),
                                             "work").items()}
    gil = "ttsfleet_inference_engine_gil_wait_seconds"
    gil_mean = total(o.rate(gil + "_sum", W)) / total(o.rate(gil + "_count", W))
    gc_pause = "ttsfleet_inference_gc_pause_seconds"
    full_gc = lambda lb: lb["generation"] == "2"  # noqa: E731
    processed = by(o.last("ttsfleet_fill_items_processed_total"), "fill_job")
    manifest = by(o.last("ttsfleet_fill_items_total_in_manifest"), "fill_job")
    stage_p99 = {}
    stage_rates = o.rate("ttsfleet_fill_stage_seconds_bucket", W)
    for stage in {dict(k)["stage"] for k in stage_rates}:
        sub = by({k: v for k, v in stage_rates.items() if dict(k)["stage"] == stage}, "le")
        stage_p99[frozenset({("stage", stage)})] = quantile(0.99, sub)
    ckpt = {frozenset({("fill_job", dict(k)["fill_job"])}): o.t - v
            for k, v in o.last("ttsfleet_fill_last_checkpoint_timestamp_seconds").items()}
    e = {
        ("ttsfleet-fleet", "Allocated", "allocated"): one(total(alloc) / total(gpus_total)),
        ("ttsfleet-fleet", "Active", "active"): one(total(active) / total(gpus_total)),
        ("ttsfleet-fleet", "Load-weighted", "load-weighted"): one(total(load) / total(gpus_total)),
        ("ttsfleet-fleet", "Idle GPUs", "idle"):
            one(total(o.last("ttsfleet_gpus", lambda lb: lb["workload"] == "idle"))),
        ("ttsfleet-fleet", "GPUs by workload (fleet)", "{{workload}}"):
            by(o.last("ttsfleet_gpus"), "workload"),
        ("ttsfleet-fleet", "GPUs by workload and GPU class", "{{gpu_class}} {{workload}}"):
            by(o.last("ttsfleet_gpus"), "gpu_class", "workload"),
        ("ttsfleet-fleet", "Active GPUs by workload", "{{workload}}"):
            by(o.last("ttsfleet_gpus_active", not_idle), "workload"),
        ("ttsfleet-fleet", "Utilization per GPU class", "{{gpu_class}} allocated"): ratio(alloc),
        ("ttsfleet-fleet", "Utilization per GPU class", "{{gpu_class}} active"): ratio(active),
        ("ttsfleet-fleet", "Utilization per GPU class", "{{gpu_class}} load-weighted"): ratio(load),
        ("ttsfleet-fleet", "GPU utilization by GPU model (DCGM_FI_DEV_GPU_UTIL)", "{{modelName}}"):
            _avg(o.last("DCGM_FI_DEV_GPU_UTIL"), "modelName"),
        ("ttsfleet-fleet", "SM active by GPU model (DCGM_FI_PROF_SM_ACTIVE)", "{{modelName}}"):
            _avg(o.last("DCGM_FI_PROF_SM_ACTIVE"), "modelName"),
        ("ttsfleet-fleet", "GPU busy (DCGM)", "busy"):
            one(_mean(o.last("DCGM_FI_DEV_GPU_UTIL")) / 100),
        ("ttsfleet-fleet", "GPU busy by workload (DCGM_FI_DEV_GPU_UTIL)", "{{workload}}"):
            {k: v / 100 for k, v in _avg(by_workload(o, "DCGM_FI_DEV_GPU_UTIL"), "workload").items()},
        ("ttsfleet-fleet", "SM active by workload (DCGM_FI_PROF_SM_ACTIVE)", "{{workload}}"):
            _avg(by_workload(o, "DCGM_FI_PROF_SM_ACTIVE"), "workload"),
        ("ttsfleet-fleet", "Busy vs allocated GPUs by workload", "{{workload}} busy (DCGM)"):
            {k: v / 100 for k, v in by(by_workload(o, "DCGM_FI_DEV_GPU_UTIL"), "workload").items()},
        ("ttsfleet-fleet", "Busy vs allocated GPUs by workload", "{{workload}} allocated (operator)"):
            by(o.last("ttsfleet_gpus", not_idle), "workload"),
        ("ttsfleet-inference", "Requests/s by status", "{{status}}"):
            by(o.rate("ttsfleet_inference_requests_total", W), "status"),
        ("ttsfleet-inference", "Errors/s by reason", "{{reason}}"):
            by(o.rate("ttsfleet_inference_errors_total", W), "reason"),
        ("ttsfleet-inference", "Frames/s", "{{deployment}}"): by(frames, "deployment"),
        ("ttsfleet-inference", "Decode load (frames / replica capacity)",
         "{{deployment}} {{gpu_class}}"): inf_load,
        ("ttsfleet-inference", "Time to first audio p50 / p99", "p50"):
            one(quantile(0.5, ttfa_buckets("ttsfleet_inference_ttfa_seconds"))),
        ("ttsfleet-inference", "Time to first audio p50 / p99", "p99"):
            one(quantile(0.99, ttfa_buckets("ttsfleet_inference_ttfa_seconds"))),
        ("ttsfleet-inference", "Requests within the TTFA SLO", "{{deployment}}"):
            {k: good[k] / count[k] for k in count},
        ("ttsfleet-inference", "Real-time factor p50 / p99", "p50"):
            one(quantile(0.5, ttfa_buckets("ttsfleet_inference_realtime_factor"))),
        ("ttsfleet-inference", "Real-time factor p50 / p99", "p99"):
            one(quantile(0.99, ttfa_buckets("ttsfleet_inference_realtime_factor"))),
        ("ttsfleet-inference", "Time to first audio by stage (mean)", "{{stage}}"): by_stage,
        ("ttsfleet-inference", "Decode step interval by phase", "{{phase}}"): by_phase,
        ("ttsfleet-inference", "Decode step GPU time in situ", "{{work}}"): by_work,
        ("ttsfleet-inference", "Event-loop lag (p99)", "p99"):
            one(quantile(0.99, ttfa_buckets("ttsfleet_inference_event_loop_lag_seconds"))),
        ("ttsfleet-inference", "Full garbage collections", "p99 pause"):
            one(quantile(0.99, by(o.rate(gc_pause + "_bucket", W, full_gc), "le"))),
        ("ttsfleet-inference", "Full garbage collections", "paused per second"):
            one(total(o.rate(gc_pause + "_sum", W, full_gc))),
        ("ttsfleet-inference", "Queue depth", "{{pod}}"): by(o.last("ttsfleet_inference_queue_depth"), "pod"),
        ("ttsfleet-inference", "Batch size", "mean per decode step"): one(bsum / bcount),
        ("ttsfleet-inference", "Batch size", "running (avg)"):
            one(_mean(o.last("ttsfleet_inference_running_batch_size"))),
        ("ttsfleet-inference", "Engine GIL wait (probe)", "mean"): one(gil_mean),
        ("ttsfleet-inference", "Engine GIL wait (probe)", "p99"): one(quantile(0.99, ttfa_buckets(gil))),
        ("ttsfleet-inference", "KV slots in use", "used"):
            one(total(o.last("ttsfleet_inference_kv_slots_used"))
                / total(o.last("ttsfleet_inference_kv_slots_total"))),
        ("ttsfleet-inference", "Replicas desired vs ready per pool", "{{pool}} desired"):
            by(o.last("ttsfleet_operator_replicas_desired"), "pool"),
        ("ttsfleet-inference", "Replicas desired vs ready per pool", "{{pool}} ready"):
            by(o.last("ttsfleet_operator_replicas_ready"), "pool"),
        ("ttsfleet-inference", "Scaling decisions in range", "{{direction}}: {{reason}}"):
            by(o.increase("ttsfleet_operator_scaling_decisions_total", RANGE,
                          lambda lb: lb["direction"] != "none"), "direction", "reason"),
        ("ttsfleet-fill", "Fill pods running", "pods"):
            one(total(o.last("ttsfleet_operator_fill_pods_running"))),
        ("ttsfleet-fill", "Fill jobs reporting", "jobs"):
            one(len(o.last("ttsfleet_fill_items_total_in_manifest"))),
        ("ttsfleet-fill", "Lost work (items, must be 0)", "lost"):
            one(total(o.last("ttsfleet_fill_items_lost_total"))),
        ("ttsfleet-fill", "Evictions stuck past grace", "stuck"):
            one(total(o.last("ttsfleet_operator_eviction_stuck"))),
        ("ttsfleet-fill", "Fill pods running per GPU class", "{{gpu_class}}"):
            by(o.last("ttsfleet_operator_fill_pods_running"), "gpu_class"),
        ("ttsfleet-fill", "Fill admissions and evictions (10 min)", "{{gpu_class}} admitted"):
            by(o.increase("ttsfleet_operator_fill_admissions_total", 600), "gpu_class"),
        ("ttsfleet-fill", "Fill admissions and evictions (10 min)", "{{gpu_class}} evicted: {{reason}}"):
            by(o.increase("ttsfleet_operator_fill_evictions_total", 600), "gpu_class", "reason"),
        ("ttsfleet-fill", "Items/s per job", "{{fill_job}}"):
            by(o.rate("ttsfleet_fill_items_processed_total", W), "fill_job"),
        ("ttsfleet-fill", "Audio seconds processed / s", "audio s/s"):
            one(total(o.rate("ttsfleet_fill_audio_seconds_processed_total", W))),
        ("ttsfleet-fill", "Rejects/s by reason", "{{reason}}"):
            by(o.rate("ttsfleet_fill_items_rejected_total", W), "reason"),
        ("ttsfleet-fill", "Manifest progress", "{{fill_job}}"):
            {k: processed[k] / manifest[k] for k in processed},
        ("ttsfleet-fill", "Stage time p99", "{{stage}}"): stage_p99,
        ("ttsfleet-fill", "Batch-stage GPU time / wall", "{{fill_job}}"):
            by(o.rate("ttsfleet_fill_batch_gpu_seconds_total", W), "fill_job"),
        ("ttsfleet-fill", "Seconds since last checkpoint", "{{fill_job}}"): ckpt,
        ("ttsfleet-fill", "Preemptions in range", "jobs resumed after preemption"):
            one(total(o.increase("ttsfleet_fill_preemptions_survived_total", RANGE))),
        ("ttsfleet-fill", "Preemptions in range", "evicted: {{reason}}"):
            by(o.increase("ttsfleet_operator_fill_evictions_total", RANGE), "reason"),
        ("ttsfleet-slurm", "Allocated GPUs per partition", "{{partition}}"):
            by(o.last("ttsfleet_slurm_gpus_allocated"), "partition"),
        ("ttsfleet-slurm", "Idle GPUs per GPU class", "{{gpu_class}}"):
            by(o.last("ttsfleet_slurm_gpus_idle"), "gpu_class"),
        ("ttsfleet-slurm", "Pending jobs per partition", "{{partition}}"):
            by(o.last("ttsfleet_slurm_jobs_pending"), "partition"),
        ("ttsfleet-slurm", "Running jobs per partition", "{{partition}}"):
            by(o.last("ttsfleet_slurm_jobs_running"), "partition"),
        ("ttsfleet-slurm", "Exporter up", "up"): one(min(o.last("ttsfleet_slurm_up").values())),
        ("ttsfleet-slurm", "Preemptions and requeues (10 min)", "{{partition}} preempted"):
            by(o.increase("ttsfleet_slurm_preemptions_total", 600), "partition"),
        ("ttsfleet-slurm", "Preemptions and requeues (10 min)", "{{partition}} requeued"):
            by(o.increase("ttsfleet_slurm_requeues_total", 600), "partition"),
        ("ttsfleet-slurm", "Fill shards submitted (10 min)", "{{gpu_class}}"):
            by(o.increase("ttsfleet_slurm_fill_submissions_total", 600), "gpu_class"),
    }
    # The timeseries version of the headline figures shows the same three numbers.
    for name in ("allocated", "active", "load-weighted"):
        e[("ttsfleet-fleet", "Utilization: allocated vs active vs load-weighted", name)] = \
            e[("ttsfleet-fleet", name.capitalize(), name)]
    return e


def by_workload(o: Oracle, metric: str) -> Vec:
    """Each GPU's DCGM value, keyed by the workload label of the pod holding it (GPUs no labelled
    pod holds left out): the join the panels do, computed from the samples."""
    workload = {(d["namespace"], d["pod"]): d["label_ttsfleet_io_workload"]
                for d in map(dict, o.last("kube_pod_labels"))}
    out: Vec = {}
    for k, v in o.last(metric).items():
        d = dict(k)
        w = workload.get((d.get("namespace", ""), d.get("pod", "")))
        if w:
            out[frozenset({**d, "workload": w}.items())] = v
    return out


def _avg(vec: Vec, label: str) -> Vec:
    sums, counts = by(vec, label), by({k: 1.0 for k in vec}, label)
    return {k: sums[k] / counts[k] for k in sums}


def _mean(vec: Vec) -> float:
    return total(vec) / len(vec)


_CACHE: dict[int, dict[tuple[str, str, str], Vec]] = {}


def expected(demo: dm.DemoData) -> dict[tuple[str, str, str], Vec]:
    if id(demo) not in _CACHE:
        _CACHE[id(demo)] = expectations(Oracle(demo, demo.end))
    return _CACHE[id(demo)]


def _targets() -> list[tuple[str, str, str, str]]:
    return [(d.uid, p.title, t.legend, t.expr) for d in all_dashboards(CAT) for p in d.panels()
            for t in p.targets]


def test_every_target_has_an_expectation(demo: dm.DemoData) -> None:
    keys = {(u, t, lg) for u, t, lg, _ in _targets()}
    exp = set(expected(demo))
    assert keys - exp == set(), "panels without an expected value"
    assert exp - keys == set(), "expectations for panels that no longer exist"


@pytest.mark.prometheus
@pytest.mark.parametrize("uid,title,legend,expr", _targets(), ids=lambda v: str(v)[:60])
def test_panel_returns_expected(prom, demo: dm.DemoData, uid: str, title: str, legend: str,
                                expr: str) -> None:
    want = expected(demo)[(uid, title, legend)]
    got = prom.query(substitute(expr), demo.end)
    assert got, f"{uid} / {title} / {legend}: no data"
    got_vec = {frozenset(r["metric"].items()): r["value"] for r in got}
    # Compare on the labels the legend shows (what a reader sees).
    shown = re.findall(r"\{\{(\w+)\}\}", legend)
    norm = lambda vec: {frozenset((k, v) for k, v in key if k in shown): val  # noqa: E731
                        for key, val in vec.items()}
    assert len(got_vec) == len(norm(got_vec)), "legend does not tell the series apart"
    g, w = norm(got_vec), norm(want)
    assert set(g) == set(w), f"series differ: got {sorted(map(sorted, g))}, want {sorted(map(sorted, w))}"
    for k in w:
        assert g[k] == pytest.approx(w[k], rel=1e-6, abs=1e-9), f"{dict(k)}: got {g[k]}, want {w[k]}"


@pytest.mark.prometheus
def test_gpu_class_variable_filters(prom, demo: dm.DemoData) -> None:
    """Picking one GPU class changes the figures to that class's own."""
    dash = next(d for d in all_dashboards(CAT) if d.uid == "ttsfleet-fleet")
    expr = next(p for p in dash.panels() if p.title == "Allocated").targets[0].expr
    o = Oracle(demo, demo.end)
    for gc in dm.TOTALS:
        got = prom.query(substitute(expr, {"gpu_class": gc}), demo.end)
        alloc = total(o.last("ttsfleet_gpus", lambda lb, gc=gc: lb["gpu_class"] == gc
                             and lb["workload"] != "idle"))
        assert got[0]["value"] == pytest.approx(alloc / dm.TOTALS[gc])


@pytest.mark.prometheus
def test_variable_queries_list_values(prom, demo: dm.DemoData) -> None:
    """Each query variable's label_values() finds the values the demo exported."""
    for d in all_dashboards(CAT):
        for v in d.variables:
            if v.kind != "query":
                continue
            m = re.fullmatch(r"label_values\((.+), (\w+)\)", v.query)
            assert m, v.query
            values = prom.api(f"label/{m.group(2)}/values", **{"match[]": substitute(m.group(1)),
                                                               "start": demo.start, "end": demo.end})
            assert values, f"{d.uid}: variable {v.name} lists nothing"

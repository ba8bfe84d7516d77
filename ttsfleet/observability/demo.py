"""A small demo fleet that produces real series through the project's own collectors.

Tests and the PNG renderer need Prometheus data without a running cluster. This module drives
the collectors from :func:`ttsfleet.metrics.make_collectors` (and stand-ins for dcgm-exporter and
kube-state-metrics, with the contract's external names)
through a three-hour day - quiet traffic, a burst that evicts a fill job and leaves a replica
pending, then a steady last 75 minutes - and writes every scrape as OpenMetrics text with
timestamps, ready for ``promtool tsdb create-blocks-from openmetrics``. Target labels a
Kubernetes scrape would attach (``namespace``, ``deployment``, ``pod``) are added here the same
way a relabel config would; the operator is scraped with ``honor_labels: true`` so its own
``namespace``/``deployment`` labels (the TTSDeployment's) are kept.

Every sample written is also kept in :attr:`DemoData.samples`, so tests can compute what a
query must return from the data itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Gauge

from ttsfleet.catalog import GpuCatalog
from ttsfleet.metrics import EXTERNAL, Collectors, make_collectors

STEP_S = 15
DURATION_S = 3 * 3600
#: Phase boundaries (seconds from the start): quiet, burst, steady until the end.
BURST_AT = 45 * 60
STEADY_AT = 105 * 60

NAMESPACE = "tts-prod"
DEPLOYMENT = "tts"
FILL_NAMESPACE = "ttsfleet-fill"
MODEL = "ttsfleet-tts"

SeriesKey = tuple[str, tuple[tuple[str, str], ...]]


@dataclass(frozen=True)
class Pod:
    """One inference replica and what it serves per 15 s scrape at full (steady) traffic."""

    name: str
    gpu_class: str
    ok: int  # finished requests with status 200 per step
    shed: int  # requests answered 503 per step
    frames: int  # decoded frames per step
    ttfa: tuple[tuple[float, int], ...]  # (seconds, requests) per step
    batch: int  # decode batch size
    queue: int
    in_flight: int


#: How the demo splits each request's time to first audio into the stages of
#: ``inference_ttfa_stage_seconds`` (shares of the whole; they add up to 1).
TTFA_STAGE_SHARES = (("arrival", 0.05), ("queue", 0.10), ("prefill", 0.30), ("decode", 0.35), ("audio", 0.20))
#: ``inference_engine_seconds`` per decode step, by phase: a served H100 replica at c=64, steady window
#: (benchmarks/inference_h200/2026-12-06d/call15-h100-prefill-coalesce-20ms, side A, served_c64.txt:
#: a 17.3 ms step).
ENGINE_STEP_SECONDS = (("gpu_wait", 0.0046), ("launch", 0.0017), ("prefill", 0.0048), ("other", 0.0063))
#: ``inference_engine_gpu_seconds`` per decode step, by work: the same run's GPU spans in situ (the
#: engine's stream busy 16.6 of the 17.3 ms).
ENGINE_STEP_GPU_SECONDS = (("decode", 0.0113), ("prefill", 0.0053))
#: ``inference_engine_gil_wait_seconds`` per scrape, as (seconds, probes): the same server's probe
#: histogram (its metrics.txt: 168 probes, 88 under 0.1 ms, 7 to 0.25, 40 to 0.5, 32 to 1, 1 to 2 ms;
#: mean 0.27 ms) scaled to 24 probes.
GIL_WAIT_PROBES = ((7e-5, 13), (2e-4, 1), (4e-4, 6), (7e-4, 4))
#: ``inference_event_loop_lag_seconds`` per scrape at full traffic, as (seconds, ticks): a served H100
#: replica at c=128, heap frozen, steady window of 20.2 s (H100, 2026-12-07d,
#: benchmarks/inference_h200/2026-12-07d/call36-h100-gc-freeze, side B, served_c128.txt: the server's
#: event loop late by mean 1.63 ms, p99 19.6 ms, 1,736 ticks): its 10 ms timer's 86 ticks a second make
#: 1,288 a scrape, spread so the mean is 1.63 ms and the p99 read from the buckets (as the bench and
#: histogram_quantile read it) 19.6 ms. The tick values are the demo's; the two figures are measured.
LOOP_LAG_TICKS = ((3e-4, 900), (8e-4, 120), (2e-3, 130), (4.5e-3, 70), (9e-3, 32), (2.4e-2, 36))
#: The same at reduced traffic (the quiet phase): that server at c=64 (its served_c64.txt, steady
#: window of 13.4 s: late by mean 1.05 ms, p99 9.6 ms, 1,206 ticks, 90 a second: 1,354 a scrape).
LOOP_LAG_TICKS_LOW = ((3e-4, 900), (8e-4, 200), (2e-3, 150), (4.5e-3, 50), (7e-3, 44), (1.6e-2, 10))
#: ``inference_gc_pause_seconds{generation="2"}`` at full traffic, as (seconds, collections) per pair
#: of scrapes: the same c=128 window's full garbage collections, 2 in 20.2 s, 25 ms in all, each
#: <= 25 ms (one, then two, every 30 s: 0.1 a second of 12.5 ms each). At c=64 it ran none, nor does
#: the demo's quiet phase.
FULL_GC_PAUSES = ((0.0125, 1), (0.0125, 2))
#: ``inference_gc_pause_seconds`` of the young generations per scrape, as (generation, seconds,
#: collections): that H100 run's summary does not report them, so these are the CPU run's
#: (benchmarks/inference_serve/README.md, gc-pauses-2026-12-07, tiny model, c=32: gen 0 ~2 a second,
#: ~0.2 ms each; gen 1 10 per ~55 s, ~1 ms each: 3 a scrape, 2 every fourth).
YOUNG_GC_PAUSES = (("0", 2e-4, 30), ("1", 1e-3, 3))

PODS = (
    Pod("tts-h200-0", "h200", 60, 0, 60000, ((0.09, 57), (0.3, 3)), 24, 0, 24),
    Pod("tts-h200-1", "h200", 60, 0, 60000, ((0.09, 56), (0.3, 4)), 24, 1, 25),
    Pod("tts-rtx5090-0", "rtx5090", 28, 2, 30000, ((0.12, 25), (0.45, 2), (0.8, 1)), 16, 3, 19),
)

#: GPUs per class and workload in each phase: (allocated, active).
TOTALS = {"h200": 8, "rtx5090": 4}
ALLOC = {
    "quiet": {"h200": {"inference": (2, 2), "training": (2, 1), "fill": (4, 4), "idle": (0, 0)},
              "rtx5090": {"inference": (1, 1), "training": (0, 0), "fill": (3, 2), "idle": (0, 0)}},
    "burst": {"h200": {"inference": (2, 2), "training": (2, 2), "fill": (3, 3), "idle": (1, 0)},
              "rtx5090": {"inference": (1, 1), "training": (0, 0), "fill": (3, 3), "idle": (0, 0)}},
    "steady": {"h200": {"inference": (2, 2), "training": (2, 1), "fill": (3, 3), "idle": (1, 0)},
               "rtx5090": {"inference": (1, 1), "training": (0, 0), "fill": (3, 2), "idle": (0, 0)}},
}
#: Fill jobs reporting metrics; the last h200 one is evicted when the burst starts.
FILL_JOBS = ("fill-h200-0", "fill-h200-1", "fill-h200-2", "fill-h200-3", "fill-rtx5090-0",
             "fill-rtx5090-1")
EVICTED_JOB = "fill-h200-3"
CHECKPOINT_EVERY_STEPS = 5
MANIFEST_ITEMS = 20000


def phase(t_rel: float) -> str:
    if t_rel < BURST_AT:
        return "quiet"
    return "burst" if t_rel < STEADY_AT else "steady"


def traffic(t_rel: float) -> float:
    """Traffic relative to the steady level: quiet 0.5 rising, a 1.3x burst, then exactly 1."""
    if t_rel < BURST_AT:
        return 0.5 + 0.2 * math.sin(math.pi * t_rel / BURST_AT)
    return 1.3 if t_rel < STEADY_AT else 1.0


@dataclass
class DemoData:
    """OpenMetrics text of the whole timeline plus every sample, keyed by series."""

    start: int
    end: int
    openmetrics: str
    samples: dict[SeriesKey, list[tuple[float, float]]] = field(default_factory=dict)
    types: dict[str, str] = field(default_factory=dict)

    def series(self, name: str, **labels: str) -> dict[SeriesKey, list[tuple[float, float]]]:
        """Series of ``name`` whose labels include ``labels``."""
        want = set(labels.items())
        return {k: v for k, v in self.samples.items() if k[0] == name and want <= set(k[1])}


class _Scrape:
    """One registry and the target labels a scrape of it would add."""

    def __init__(self, registry: CollectorRegistry, target: dict[str, str]) -> None:
        self.registry = registry
        self.target = target


def _dcgm(registry: CollectorRegistry) -> tuple[Gauge, Gauge]:
    """A stand-in dcgm-exporter with Kubernetes pod mapping (names: the contract's external list)."""
    util, sm = (EXTERNAL[n] for n in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE"))
    return (Gauge(util.name, util.help, util.labels, registry=registry),
            Gauge(sm.name, sm.help, sm.labels, registry=registry))


def _ksm(registry: CollectorRegistry) -> Gauge:
    """A stand-in kube-state-metrics exposing each GPU pod's ttsfleet.io/workload label."""
    m = EXTERNAL["kube_pod_labels"]
    return Gauge(m.name, m.help, m.labels, registry=registry)


#: Hardware utilization of a GPU with work running, per workload class, as (DCGM_FI_DEV_GPU_UTIL %,
#: DCGM_FI_PROF_SM_ACTIVE). Fill: the measured H200 fill job (benchmarks/fill_jobs/RESULTS.md,
#: 2026-12-01, NVML 97 %); inference and training: illustrative demo values.
DCGM_BUSY = {"inference": (64, 0.45), "training": (92, 0.71), "fill": (97, 0.80)}
TRAINING_NAMESPACE = "research"


def gpu_holders(ph: str) -> dict[tuple[str, int], tuple[str, str, str, bool]]:
    """Which pod holds each GPU in phase ``ph``: ``(class, index) -> (workload, namespace, pod,
    busy)``. Pods are the demo's inference replicas, its fill jobs (plus one starting pod per
    missing slot) and training pods; the first ``active`` pods of a workload have work running."""
    out = {}
    for gc, wl in ALLOC[ph].items():
        pods = {
            "inference": [(NAMESPACE, p.name) for p in PODS if p.gpu_class == gc],
            "training": [(TRAINING_NAMESPACE, f"train-{gc}-{k}") for k in range(wl["training"][0])],
            "fill": [(FILL_NAMESPACE, j) for j in FILL_JOBS if j.startswith(f"fill-{gc}-")
                     and not (j == EVICTED_JOB and ph != "quiet")],
        }
        pods["fill"] += [(FILL_NAMESPACE, f"fill-{gc}-{k}")
                         for k in range(len(pods["fill"]), wl["fill"][0])]
        k = 0
        for workload in ("inference", "training", "fill"):
            alloc, active = wl[workload]
            assert len(pods[workload]) == alloc, (ph, gc, workload)
            for n, (ns, pod) in enumerate(pods[workload]):
                out[(gc, k)] = (workload, ns, pod, n < active)
                k += 1
    return out


def generate(start: int, duration_s: int = DURATION_S, step_s: int = STEP_S) -> DemoData:
    """Run the demo fleet from ``start`` (unix seconds) and return its scrapes."""
    catalog = GpuCatalog.default()
    core = make_collectors(["core", "operator"])
    slurm = make_collectors("slurm")
    pods = {p.name: make_collectors("inference") for p in PODS}
    jobs = {j: make_collectors("fill") for j in FILL_JOBS}
    dcgm_reg, ksm_reg = CollectorRegistry(), CollectorRegistry()
    dcgm_util, dcgm_sm = _dcgm(dcgm_reg)
    ksm_pods = _ksm(ksm_reg)
    # dcgm-exporter and kube-state-metrics are scraped with honor_labels: their namespace/pod
    # labels name the pod holding the GPU, not the exporter's own pod.
    scrapes = [_Scrape(core.registry, {"job": "ttsfleet-operator"}),
               _Scrape(slurm.registry, {"job": "ttsfleet-slurm-exporter"}),
               _Scrape(dcgm_reg, {"job": "dcgm-exporter"}),
               _Scrape(ksm_reg, {"job": "kube-state-metrics"})]
    for p in PODS:
        c = pods[p.name]
        g = catalog.get(p.gpu_class)
        c["inference_build"].info({"model": MODEL, "gpu_class": p.gpu_class,
                                   "quantization": g.quantization,
                                   "cuda_graph_max_bs": str(g.serving.cuda_graph_max_bs)})
        c["inference_kv_slots_total"].labels(MODEL).set(g.serving.max_running_requests)
        scrapes.append(_Scrape(c.registry, {"job": "ttsfleet-inference", "namespace": NAMESPACE,
                                            "deployment": DEPLOYMENT, "pod": p.name}))
    job_scrapes = {j: _Scrape(jobs[j].registry, {"job": "ttsfleet-fill", "namespace": FILL_NAMESPACE,
                                                 "pod": j}) for j in FILL_JOBS}
    for j in FILL_JOBS:
        jobs[j]["fill_items_total_in_manifest"].labels(j).set(MANIFEST_ITEMS)
        jobs[j]["fill_items_lost"].labels(j)  # exported as 0 from the start
        jobs[j]["fill_batch_gpu_seconds"].labels(j)
    slurm["slurm_up"].set(1)
    # Counter children exist (at 0) before their first event, as exporters should create them:
    # increase() cannot see the first event of a series that appears with value 1.
    for pool in ("h200", "rtx5090"):
        for direction, reason in (("up", "in_flight_above_target"), ("down", "in_flight_below_target"),
                                  ("none", "within_target")):
            core["operator_scaling_decisions"].labels(NAMESPACE, DEPLOYMENT, pool, direction, reason)
    for gc, reason in (("h200", "inference_scale_up"), ("rtx5090", "inference_headroom")):
        core["operator_fill_evictions"].labels(gc, reason)
    for gc in TOTALS:
        core["operator_fill_admissions"].labels(gc)
    for part in ("train", "fill"):
        slurm["slurm_preemptions"].labels(part)
        slurm["slurm_requeues"].labels(part)
    slurm["slurm_fill_submissions"].labels("h200")

    data = DemoData(start=start, end=start + duration_s, openmetrics="")
    per_series: dict[SeriesKey, list[tuple[float, float]]] = defaultdict(list)
    last_ckpt = {j: float(start) for j in FILL_JOBS}
    prev_phase = "quiet"
    for i in range(duration_s // step_s + 1):
        t_rel = i * step_s
        t = start + t_rel
        ph, f = phase(t_rel), traffic(t_rel)
        _step_fleet(core, ph, prev_phase, i)
        _step_dcgm(dcgm_util, dcgm_sm, ksm_pods, ph)
        for p in PODS:
            _step_pod(pods[p.name], p, f, i)
        live_jobs = [j for j in FILL_JOBS if not (j == EVICTED_JOB and ph != "quiet")]
        for j in live_jobs:
            _step_job(jobs[j], j, i, t, last_ckpt, ph != prev_phase and j == "fill-h200-0")
        _step_slurm(slurm, i, ph, prev_phase)
        prev_phase = ph
        for s in scrapes + [job_scrapes[j] for j in live_jobs]:
            for fam in s.registry.collect():
                data.types[fam.name] = fam.type
                for smp in fam.samples:
                    if smp.name.endswith("_created"):
                        continue
                    labels = tuple(sorted({**smp.labels, **s.target}.items()))
                    per_series[(smp.name, labels)].append((float(t), float(smp.value)))
    data.samples = dict(per_series)
    data.openmetrics = to_openmetrics(data)
    return data


def _step_fleet(c: Collectors, ph: str, prev: str, i: int) -> None:
    for gc, wl in ALLOC[ph].items():
        c["gpus_total"].labels(gc).set(TOTALS[gc])
        for w, (alloc, active) in wl.items():
            c["gpus"].labels(gc, w).set(alloc)
            c["gpus_active"].labels(gc, w).set(active)
        c["operator_fill_pods_running"].labels(gc).set(wl["fill"][0])
        c["operator_eviction_stuck"].labels(gc).set(1 if ph == "burst" and gc == "h200" and
                                                    i % 80 < 8 else 0)
    h200_desired = 3 if ph == "burst" else 2
    for pool, desired, ready in (("h200", h200_desired, 2), ("rtx5090", 1, 1)):
        c["operator_replicas_desired"].labels(NAMESPACE, DEPLOYMENT, pool, pool).set(desired)
        c["operator_replicas_ready"].labels(NAMESPACE, DEPLOYMENT, pool, pool).set(ready)
        # The operator evaluates every tick; most ticks decide nothing.
        direction, reason = "none", "within_target"
        if ph != prev and pool == "h200":
            direction, reason = ("up", "in_flight_above_target") if ph == "burst" else (
                "down", "in_flight_below_target")
        c["operator_scaling_decisions"].labels(NAMESPACE, DEPLOYMENT, pool, direction, reason).inc()
    if ph == "burst" and prev == "quiet":
        c["operator_fill_evictions"].labels("h200", "inference_scale_up").inc()
    if i % 40 == 39:  # rtx5090 fill pods cycle: one is evicted and re-admitted every 10 minutes
        c["operator_fill_evictions"].labels("rtx5090", "inference_headroom").inc()
        c["operator_fill_admissions"].labels("rtx5090").inc()
    if ph == "steady" and prev == "burst":
        c["operator_fill_admissions"].labels("h200").inc()


def _step_dcgm(util: Gauge, sm: Gauge, ksm: Gauge, ph: str) -> None:
    for g in (util, sm, ksm):  # pods come and go: only this scrape's series exist
        g.clear()
    holders = gpu_holders(ph)
    for gc in TOTALS:
        model = GpuCatalog.default().get(gc).display_name
        for k in range(TOTALS[gc]):
            workload, ns, pod, busy = holders.get((gc, k), ("idle", "", "", False))
            lbl = (str(k), f"GPU-{gc}-{k:04d}", model, f"{gc}-node-{k // 4}", ns, pod, "main" if pod else "")
            u, a = DCGM_BUSY.get(workload, (0, 0.0)) if busy else (0, 0.0)
            util.labels(*lbl).set(u)
            sm.labels(*lbl).set(a)
            if pod:
                ksm.labels(ns, pod, workload).set(1)


def _step_pod(c: Collectors, p: Pod, f: float, i: int) -> None:
    m = MODEL
    c["inference_requests"].labels(m, "200").inc(round(p.ok * f))
    if p.shed:
        c["inference_requests"].labels(m, "503").inc(round(p.shed * f))
        c["inference_errors"].labels(m, "overloaded").inc(round(p.shed * f))
    c["inference_frames"].labels(m).inc(round(p.frames * f))
    for v, n in p.ttfa:
        for _ in range(int(n * f)):
            c["inference_ttfa_seconds"].labels(m).observe(v)
            for stage, share in TTFA_STAGE_SHARES:
                c["inference_ttfa_stage_seconds"].labels(m, stage).observe(v * share)
            c["inference_request_duration_seconds"].labels(m).observe(3.0)
            c["inference_realtime_factor"].labels(m).observe(0.08 if p.gpu_class == "h200" else 0.15)
    for k in range(20):  # sampled decode steps; every fourth one runs a half-drained batch
        c["inference_batch_size"].labels(m).observe(p.batch if k % 4 else p.batch // 2)
    for phase, seconds in ENGINE_STEP_SECONDS:  # the engine loop's time for those 20 steps
        c["inference_engine_seconds"].labels(m, phase).inc(20 * seconds)
    for work, seconds in ENGINE_STEP_GPU_SECONDS:  # the engine's GPU time for those 20 steps
        c["inference_engine_gpu_seconds"].labels(m, work).inc(20 * seconds)
    for seconds, n in GIL_WAIT_PROBES:  # the engine's GIL probes (every 16th busy iteration)
        for _ in range(n):
            c["inference_engine_gil_wait_seconds"].labels(m).observe(seconds)
    full = f >= 1.0  # the burst and the steady phase: the c=128 figures; the quiet phase: c=64's
    lag = c["inference_event_loop_lag_seconds"].labels(m)
    for seconds, n in LOOP_LAG_TICKS if full else LOOP_LAG_TICKS_LOW:  # the loop's 10 ms ticks
        for _ in range(n):
            lag.observe(seconds)
    gc_pause = c["inference_gc_pause_seconds"]
    for gen, seconds, n in YOUNG_GC_PAUSES:
        for _ in range(n - (gen == "1" and i % 4 == 3)):
            gc_pause.labels(m, gen).observe(seconds)
    full_gc = gc_pause.labels(m, "2")  # exported from the start, at 0 while no full pass runs
    if full:
        seconds, n = FULL_GC_PAUSES[i % 2]
        for _ in range(n):
            full_gc.observe(seconds)
    c["inference_queue_depth"].labels(m).set(round(p.queue * f))
    c["inference_running_batch_size"].labels(m).set(p.batch)
    c["inference_requests_in_flight"].labels(m).set(round(p.in_flight * f))
    c["inference_kv_slots_used"].labels(m).set(round(p.in_flight * f))
    c["inference_ready"].labels(m).set(1)


def _step_job(c: Collectors, j: str, i: int, t: int, last_ckpt: dict[str, float], preempted: bool) -> None:
    items = 10 + 2 * FILL_JOBS.index(j)  # shards differ in item length, so jobs differ in speed
    c["fill_items_processed"].labels(j).inc(items)
    c["fill_audio_seconds_processed"].labels(j).inc(items * 8.5)
    # GPU time of the batch stages per 15 s step: the measured H200 fill job's share (0.99 of wall,
    # benchmarks/fill_jobs/RESULTS.md) on h200, an illustrative 0.9 elsewhere.
    c["fill_batch_gpu_seconds"].labels(j).inc(STEP_S * (0.99 if "h200" in j else 0.9))
    c["fill_items_rejected"].labels(j, "clipping").inc(1)
    c["fill_items_rejected"].labels(j, "low_snr").inc(2)
    for stage, secs in (("vad", 0.3), ("loudness", 0.1), ("snr", 0.5)):
        for _ in range(3):
            c["fill_stage_seconds"].labels(j, stage).observe(secs)
    if i % CHECKPOINT_EVERY_STEPS == 0:
        c["fill_checkpoints"].labels(j).inc()
        last_ckpt[j] = float(t)
    c["fill_last_checkpoint_timestamp_seconds"].labels(j).set(last_ckpt[j])
    c["fill_seconds_since_checkpoint"].labels(j).set(t - last_ckpt[j])
    if preempted:
        c["fill_preemptions_survived"].labels(j).inc()
    else:
        c["fill_preemptions_survived"].labels(j)


def _step_slurm(c: Collectors, i: int, ph: str, prev: str) -> None:
    # During the burst a training job takes the h200 the Slurm fill job held.
    burst = ph == "burst"
    c["slurm_gpus_allocated"].labels("train", "h200").set(3 if burst else 2)
    c["slurm_gpus_allocated"].labels("fill", "h200").set(0 if burst else 1)
    c["slurm_gpus_allocated"].labels("fill", "rtx5090").set(2)
    c["slurm_gpus_idle"].labels("h200").set(1)
    c["slurm_gpus_idle"].labels("rtx5090").set(0)
    for part, pending, running in (("train", 1 if burst else 3, 3 if burst else 2),
                                   ("fill", 8 if burst else 5, 2 if burst else 3)):
        c["slurm_jobs_pending"].labels(part).set(pending)
        c["slurm_jobs_running"].labels(part).set(running)
    if burst and prev == "quiet":
        c["slurm_preemptions"].labels("fill").inc()
        c["slurm_requeues"].labels("fill").inc()
    if i % 40 == 20 and not burst:  # the fill agent submits a shard every 10 minutes
        c["slurm_fill_submissions"].labels("h200").inc()


def _fmt_labels(labels: tuple[tuple[str, str], ...]) -> str:
    if not labels:
        return ""
    esc = (v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for _, v in labels)
    return "{" + ",".join(f'{k}="{v}"' for (k, _), v in zip(labels, esc, strict=True)) + "}"


def _family_of(sample: str, types: dict[str, str]) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total", "_info"):
        base = sample.removesuffix(suffix)
        if base != sample and base in types:
            return base
    return sample


def to_openmetrics(data: DemoData) -> str:
    """Every sample with its timestamp, one metric family at a time, ending with ``# EOF``."""
    fams: dict[str, list[SeriesKey]] = defaultdict(list)
    for key in data.samples:
        fams[_family_of(key[0], data.types)].append(key)
    out: list[str] = []
    for fam, keys in sorted(fams.items()):
        typ = data.types.get(fam, "unknown")
        out.append(f"# TYPE {fam} {typ}")
        # Group a histogram's bucket/count/sum lines of one label set and timestamp together.
        groups: dict[tuple[tuple[str, str], ...], list[SeriesKey]] = defaultdict(list)
        for k in keys:
            groups[tuple(kv for kv in k[1] if kv[0] != "le")].append(k)
        for _, members in sorted(groups.items()):
            members.sort(key=_member_order)
            for idx in range(len(data.samples[members[0]])):
                for k in members:
                    t, v = data.samples[k][idx]
                    out.append(f"{k[0]}{_fmt_labels(k[1])} {v!r} {t:.3f}")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def _member_order(k: SeriesKey) -> tuple[int, float]:
    name, labels = k
    if name.endswith("_bucket"):
        le = dict(labels)["le"]
        return (0, math.inf if le == "+Inf" else float(le))
    return (1 if name.endswith("_count") else 2, 0.0)

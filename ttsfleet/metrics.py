"""The metric contract: every Prometheus metric ttsfleet exposes, defined exactly once.

Exporters (inference server, fill jobs, operator, Slurm exporter, simulator) create their
collectors through :func:`make_collectors`, dashboards and alert rules refer to the names in
:data:`CONTRACT`, and tests check that nothing outside this module invents a metric name. A new
metric is one :class:`MetricSpec` line below.

Names follow Prometheus conventions: a ``ttsfleet_`` prefix, base units (seconds, bytes), and
``_total`` on counters (prometheus-client appends it; ``name`` here is the base name).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info

MetricType = Literal["counter", "gauge", "histogram", "info"]

PREFIX = "ttsfleet_"

#: Buckets for time-to-first-audio and other sub-second latencies (seconds).
LATENCY_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5,
                   2.0, 3.0, 5.0, 10.0)
#: Buckets for whole-request durations (seconds).
DURATION_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
#: Buckets for real-time factor (generation time / audio duration; < 1 is faster than real time).
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
#: Buckets for decode batch sizes.
BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
#: Seconds to re-take the GIL: microseconds free, the switch interval (5 ms) or more contended.
GIL_WAIT_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 3e-3, 4e-3, 5e-3, 6e-3, 1e-2, 2e-2)
#: How late the server's event loop wakes (s): a free loop's ~0.1 ms up to the hundreds of ms that
#: would make a first-audio tail.
LOOP_LAG_BUCKETS = (5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)
#: How long one of Python's garbage collections stopped the process (s): a young generation's ~0.1 ms
#: up to a full pass over an unfrozen heap of torch's and the server's objects (~80 ms on a CPU box
#: with ~219k of them) and beyond.
GC_PAUSE_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: its full name, type, help text, labels and (for histograms) buckets."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    component: str = "core"

    @property
    def exposed_names(self) -> tuple[str, ...]:
        """Series names as Prometheus sees them (counters gain ``_total``, histograms parts)."""
        if self.type == "counter":
            return (self.name + "_total",)
        if self.type == "histogram":
            return (self.name + "_bucket", self.name + "_sum", self.name + "_count")
        if self.type == "info":
            return (self.name + "_info",)
        return (self.name,)


def _m(component: str, name: str, type_: MetricType, help_: str, labels: Iterable[str] = (),
       buckets: tuple[float, ...] | None = None) -> MetricSpec:
    return MetricSpec(PREFIX + name, type_, help_, tuple(labels), buckets, component)


# Shared label names. Keeping them in one place keeps joins in PromQL possible.
L_GPU_CLASS = "gpu_class"
L_DEPLOYMENT = "deployment"
L_NAMESPACE = "namespace"
L_POOL = "pool"
L_WORKLOAD = "workload"  # inference | training | fill | idle
L_REASON = "reason"
L_JOB = "fill_job"
L_STAGE = "stage"
L_PARTITION = "partition"
L_STATUS = "status"
L_DIRECTION = "direction"  # up | down | none
L_MODEL = "model"
L_DATASET = "dataset"  # a fill dataset (manifest) the Slurm fill agent cuts into shards
L_PHASE = "phase"  # an engine iteration's phase: prefill | launch | gpu_wait | other
L_GPU_WORK = "work"  # the engine's GPU work timed by CUDA events: decode | prefill
L_GENERATION = "generation"  # a generation of Python's garbage collector: 0 | 1 | 2

WORKLOAD_CLASSES = ("inference", "training", "fill", "idle")

CONTRACT_LIST: tuple[MetricSpec, ...] = (
    # --- inference server (one replica) -------------------------------------------------------
    _m("inference", "inference_requests_in_flight", "gauge",
       "Requests admitted and not yet finished (decoding or prefilling).", [L_MODEL]),
    _m("inference", "inference_queue_depth", "gauge",
       "Requests waiting for a decode slot.", [L_MODEL]),
    _m("inference", "inference_running_batch_size", "gauge",
       "Requests in the current decode batch.", [L_MODEL]),
    _m("inference", "inference_batch_size", "histogram",
       "Decode batch size per decode step.", [L_MODEL], BATCH_BUCKETS),
    _m("inference", "inference_frames", "counter",
       "Audio frames decoded (one slow step plus its codebooks; 21.53 frames = 1 s).", [L_MODEL]),
    _m("inference", "inference_prefill_tokens", "counter",
       "Prompt tokens prefilled into the KV cache (a prompt's reused head is counted in "
       "inference_prefill_tokens_reused instead): with inference_requests, the prompt length a "
       "workload carries, which sets prefill's share of the GPU.", [L_MODEL]),
    _m("inference", "inference_prefill_tokens_reused", "counter",
       "Prompt tokens restored from a head prefilled earlier (real-time mode's prefill at connection "
       "open, later text segments) instead of prefilled again.", [L_MODEL]),
    _m("inference", "inference_requests", "counter",
       "Finished requests by HTTP status code.", [L_MODEL, L_STATUS]),
    _m("inference", "inference_errors", "counter",
       "Requests that failed, by reason.", [L_MODEL, L_REASON]),
    _m("inference", "inference_ttfa_seconds", "histogram",
       "Time to first audio: the server receiving the request to the first audio chunk sent.", [L_MODEL],
       LATENCY_BUCKETS),
    _m("inference", "inference_ttfa_stage_seconds", "histogram",
       "Time to first audio split by stage (intake: the request's dependencies, body read, parse "
       "and validation, before its handler's mark; arrival: to the engine's queue; inbox: until the engine "
       "thread takes it, between two of its iterations; queue: waiting for admission (see "
       "admission_waits); prefill: the prompt into the cache; decode: to the first chunk of codes; "
       "audio: codec, encoding and sending); the stages of one request add up to its time to first audio.",
       [L_MODEL, L_STAGE], LATENCY_BUCKETS),
    _m("inference", "inference_admission_waits", "counter",
       "Engine iterations that ended with requests still waiting for admission, by what held the "
       "next in line back (slots: no free KV slot; budget: the iteration's prefill tokens spent, first "
       "on prompts already prefilling; batch: the decode batch full; hold: prefill coalescing waits; "
       "deferred: only background prefix-only jobs, which no text waits for yet, were left, passed "
       "over by later requests whose first-audio clock runs: the engine's clocked-first order).",
       [L_MODEL, L_REASON]),
    _m("inference", "inference_codec_pushes", "counter",
       "Codec decode calls, in the codec thread or the codec process: one batched push of streams x "
       "frames. Frames per push = codec_frames / codec_pushes; small pushes waste the GPU (H200: 64 "
       "streams x 4 frames cost 78 us a frame, 1 x 1 2,360 us).", [L_MODEL]),
    _m("inference", "inference_codec_rounds", "counter",
       "Codec decode rounds: each decodes the streams due at once, in one push per frame count. Frames "
       "per round = codec_frames / codec_rounds: how many streams' codes a gather window "
       "(serve --codec-gather-ms) brought together.", [L_MODEL]),
    _m("inference", "inference_codec_frames", "counter",
       "Audio frames the codec decoded to audio (every push decodes its streams x frames).", [L_MODEL]),
    _m("inference", "inference_codec_busy_seconds", "counter",
       "Wall seconds the codec spent in decode rounds, in its thread or its process: its rate (busy "
       "seconds per wall second) is the codec's load, 1 when it never idles.", [L_MODEL]),
    _m("inference", "inference_engine_seconds", "counter",
       "Wall seconds of the engine thread's busy iterations by phase (prefill: prompt pieces through "
       "the model; launch: queueing decode steps; gpu_wait: waiting for a step's frames, the GPU "
       "setting the pace; other: admission, hand-offs to the codec, bookkeeping). Divided by "
       "inference_batch_size's count (decode steps): where each step's interval goes, host or GPU.",
       [L_MODEL, L_PHASE]),
    _m("inference", "inference_engine_gpu_seconds", "counter",
       "GPU seconds of the engine's own work on its CUDA stream, by kind (decode: each step, its "
       "graph replay and frame copy; prefill: each prompt call), from CUDA events at each one's start "
       "and end: the span from the stream reaching the start to reaching the end, so the work itself "
       "plus whatever slowed it there (the codec process's kernels beside it under MPS, launch gaps). "
       "Divided by inference_batch_size's count: a decode step's GPU time in situ, set beside its "
       "replay alone (bench engine) and beside inference_engine_seconds's interval. CUDA only.",
       [L_MODEL, L_GPU_WORK]),
    _m("inference", "inference_engine_gil_wait_seconds", "histogram",
       "How long the engine thread waited to get the Python interpreter (GIL) back after letting go "
       "of it, probed every 16th busy iteration: microseconds when no other thread of the server "
       "wants it, up to the switch interval (5 ms) when one holds it. Every torch call and GPU wait "
       "lets go once, so a mean well above microseconds says the server's other threads (HTTP, the "
       "codec's hand-offs) slow the decode loop.", [L_MODEL], GIL_WAIT_BUCKETS),
    _m("inference", "inference_event_loop_lag_seconds", "histogram",
       "How late the server's event loop woke for a timer it set every 10 ms (the loop that parses "
       "HTTP, hands the codec's audio to each stream and writes it): every request's first audio "
       "leaves through it, so its tail is part of theirs; a lag of tens of ms says the loop waited "
       "for the interpreter (the engine thread's launches, the codec's hand-offs) or for its own work.",
       [L_MODEL], LOOP_LAG_BUCKETS),
    _m("inference", "inference_gc_pause_seconds", "histogram",
       "How long each of the server process's Python garbage collections held the interpreter, by "
       "generation (2: the full pass over every tracked object): no thread of the server runs meanwhile, "
       "neither the engine's decode loop nor the event loop sending first audio, so a pause lands in "
       "every request in flight. serve --gc-freeze (on by default) freezes start-up's objects after "
       "the warm-up so full passes walk only what requests made.", [L_MODEL, L_GENERATION],
       GC_PAUSE_BUCKETS),
    _m("inference", "inference_request_duration_seconds", "histogram",
       "Request arrival to the last audio byte sent.", [L_MODEL], DURATION_BUCKETS),
    _m("inference", "inference_realtime_factor", "histogram",
       "Generation wall time divided by generated audio duration.", [L_MODEL], RTF_BUCKETS),
    _m("inference", "inference_kv_slots_used", "gauge",
       "KV cache slots in use.", [L_MODEL]),
    _m("inference", "inference_kv_slots_total", "gauge",
       "KV cache slots available (max running requests).", [L_MODEL]),
    _m("inference", "inference_ready", "gauge",
       "1 while the replica accepts traffic, 0 while starting or draining.", [L_MODEL]),
    _m("inference", "inference_build", "info",
       "Model, GPU class, quantization and cuda_graph_max_bs of this replica."),
    # --- fill jobs -----------------------------------------------------------------------------
    _m("fill", "fill_items_processed", "counter",
       "Manifest items finished (accepted or rejected).", [L_JOB]),
    _m("fill", "fill_items_rejected", "counter",
       "Items rejected by a cleaning stage, by reason.", [L_JOB, L_REASON]),
    _m("fill", "fill_items_lost", "counter",
       "Items whose committed output was lost or duplicated (must stay 0).", [L_JOB]),
    _m("fill", "fill_audio_seconds_processed", "counter",
       "Seconds of input audio processed.", [L_JOB]),
    _m("fill", "fill_checkpoints", "counter",
       "Checkpoints written.", [L_JOB]),
    _m("fill", "fill_last_checkpoint_timestamp_seconds", "gauge",
       "Unix time of the last checkpoint written.", [L_JOB]),
    _m("fill", "fill_seconds_since_checkpoint", "gauge",
       "Seconds since the last checkpoint (work at risk on SIGKILL).", [L_JOB]),
    _m("fill", "fill_preemptions_survived", "counter",
       "Preemptions (SIGTERM/SIGUSR1/SIGINT or restarts after SIGKILL) this job resumed from.",
       [L_JOB]),
    _m("fill", "fill_stage_seconds", "histogram",
       "Time spent per item in each cleaning stage.", [L_JOB, L_STAGE], DURATION_BUCKETS),
    _m("fill", "fill_items_total_in_manifest", "gauge",
       "Items in this job's manifest shard.", [L_JOB]),
    _m("fill", "fill_batch_gpu_seconds", "counter",
       "Device time of the job's batch stages (CUDA events around each batch; stays 0 on CPU): "
       "its rate is the job's own GPU busy fraction, also where no dcgm-exporter runs.", [L_JOB]),
    # --- operator ------------------------------------------------------------------------------
    _m("operator", "operator_replicas_desired", "gauge",
       "Replicas the autoscaler wants per deployment pool.", [L_NAMESPACE, L_DEPLOYMENT, L_POOL,
                                                              L_GPU_CLASS]),
    _m("operator", "operator_replicas_ready", "gauge",
       "Ready replicas per deployment pool.", [L_NAMESPACE, L_DEPLOYMENT, L_POOL, L_GPU_CLASS]),
    _m("operator", "operator_scaling_decisions", "counter",
       "Autoscaling decisions by direction and reason.", [L_NAMESPACE, L_DEPLOYMENT, L_POOL,
                                                          L_DIRECTION, L_REASON]),
    _m("operator", "operator_fill_pods_running", "gauge",
       "Fill pods running per GPU class.", [L_GPU_CLASS]),
    _m("operator", "operator_fill_evictions", "counter",
       "Fill pods evicted to make room for inference, by reason.", [L_GPU_CLASS, L_REASON]),
    _m("operator", "operator_fill_admissions", "counter",
       "Fill pods started on idle GPUs.", [L_GPU_CLASS]),
    _m("operator", "operator_eviction_stuck", "gauge",
       "Fill pods still terminating past their grace period.", [L_GPU_CLASS]),
    _m("operator", "operator_reconcile_errors", "counter",
       "Reconcile failures by resource kind.", ["kind"]),
    # --- GPU allocation by workload (operator, Slurm exporter and simulator all export it) ----
    _m("core", "gpus", "gauge",
       "GPUs by class and the workload holding them (inference|training|fill|idle).",
       [L_GPU_CLASS, L_WORKLOAD]),
    _m("core", "gpus_active", "gauge",
       "GPUs with work running, by class and workload (an inference replica with a request "
       "in flight, a running fill or training job).", [L_GPU_CLASS, L_WORKLOAD]),
    _m("core", "gpus_total", "gauge", "GPUs in the fleet by class.", [L_GPU_CLASS]),
    # --- Slurm exporter ------------------------------------------------------------------------
    _m("slurm", "slurm_gpus_allocated", "gauge",
       "GPUs allocated to running jobs, per partition and GPU class.", [L_PARTITION, L_GPU_CLASS]),
    _m("slurm", "slurm_gpus_idle", "gauge",
       "GPUs configured but not allocated, per GPU class.", [L_GPU_CLASS]),
    _m("slurm", "slurm_jobs_pending", "gauge", "Pending jobs per partition.", [L_PARTITION]),
    _m("slurm", "slurm_jobs_running", "gauge", "Running jobs per partition.", [L_PARTITION]),
    _m("slurm", "slurm_preemptions", "counter",
       "Jobs preempted (seen leaving RUNNING for PREEMPTED/REQUEUED).", [L_PARTITION]),
    _m("slurm", "slurm_requeues", "counter", "Job requeues observed.", [L_PARTITION]),
    _m("slurm", "slurm_fill_submissions", "counter",
       "Fill shards submitted by the fill agent.", [L_GPU_CLASS]),
    _m("slurm", "slurm_up", "gauge", "1 when the last Slurm query succeeded."),
    _m("slurm", "slurm_fill_shards_stalled", "gauge",
       "Fill shards whose last job ended without finishing the shard (SIGKILL/OOM, full disk, "
       "unreadable checkpoint) and that no job carries now: waiting to be resubmitted or out "
       "of retries.", [L_DATASET]),
    _m("slurm", "slurm_fill_shards_given_up", "gauge",
       "Stalled fill shards whose retry budget is used up: they need a person.", [L_DATASET]),
    _m("slurm", "slurm_fill_shard_failures", "counter",
       "Fill shard jobs seen ending without finishing their shard and without a requeue.",
       [L_DATASET]),
    _m("slurm", "slurm_fill_shard_retries", "counter",
       "Failed fill shards the agent submitted again (resuming from their checkpoint).",
       [L_DATASET]),
    _m("slurm", "slurm_fill_gpu_seconds", "counter",
       "GPU-seconds held by jobs of the fill partition (allocated GPUs x elapsed run time, as "
       "sacct's AllocTRES x Elapsed counts it).", [L_PARTITION, L_GPU_CLASS]),
)

CONTRACT: dict[str, MetricSpec] = {m.name: m for m in CONTRACT_LIST}
if len(CONTRACT) != len(CONTRACT_LIST):  # pragma: no cover - guarded by tests too
    raise RuntimeError("duplicate metric name in the contract")


# --- external metrics: other exporters' names that dashboards and rules may use -------------
#: The pod label every ttsfleet pod carries (inference | fill | training), and the Prometheus label
#: kube-state-metrics turns it into (``--metric-labels-allowlist=pods=[ttsfleet.io/workload]``).
POD_WORKLOAD_LABEL = "ttsfleet.io/workload"
KSM_WORKLOAD_LABEL = "label_ttsfleet_io_workload"
#: Labels dcgm-exporter attaches per GPU; with Kubernetes pod mapping (the GPU Operator's default)
#: also the holding pod's ``namespace``/``pod``/``container`` (empty on a GPU no pod holds).
DCGM_LABELS = ("gpu", "UUID", "modelName", "Hostname", "namespace", "pod", "container")


@dataclass(frozen=True)
class ExternalMetric:
    """A series another exporter owns: named here so queries are checked against it, never
    created by ttsfleet (no ``ttsfleet_`` prefix, no collectors)."""

    name: str
    type: MetricType
    help: str
    labels: tuple[str, ...]
    source: str  # the exporter that owns it


EXTERNAL_LIST: tuple[ExternalMetric, ...] = (
    ExternalMetric("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization in % (NVML's: share of time a "
                   "kernel ran).", DCGM_LABELS, "dcgm-exporter"),
    ExternalMetric("DCGM_FI_PROF_SM_ACTIVE", "gauge", "Ratio of cycles an SM has at least one warp "
                   "assigned (0-1).", DCGM_LABELS, "dcgm-exporter"),
    ExternalMetric("kube_pod_labels", "gauge", "1 per pod, its allow-listed labels as label_* "
                   "labels.", ("namespace", "pod", KSM_WORKLOAD_LABEL), "kube-state-metrics"),
)
EXTERNAL: dict[str, ExternalMetric] = {m.name: m for m in EXTERNAL_LIST}


def spec(name: str) -> MetricSpec:
    """Look up a metric by full name (``ttsfleet_...``) or by name without the prefix."""
    key = name if name.startswith(PREFIX) else PREFIX + name
    try:
        return CONTRACT[key]
    except KeyError:
        raise KeyError(f"metric {key!r} is not in the ttsfleet metric contract") from None


def all_exposed_names() -> set[str]:
    """Every series name ttsfleet exposes (for checking dashboards and rules)."""
    return {n for m in CONTRACT_LIST for n in m.exposed_names}


def external_names() -> set[str]:
    """Series names of other exporters that queries may use (:data:`EXTERNAL_LIST`)."""
    return set(EXTERNAL)


@dataclass
class Collectors:
    """prometheus-client collectors for one component, keyed by short name (no prefix)."""

    registry: CollectorRegistry
    by_name: dict[str, Counter | Gauge | Histogram | Info] = field(default_factory=dict)

    def __getitem__(self, short: str) -> Counter | Gauge | Histogram | Info:
        return self.by_name[short.removeprefix(PREFIX)]


def make_collectors(component: str | Iterable[str],
                    registry: CollectorRegistry | None = None) -> Collectors:
    """Create the collectors of ``component`` (or several) from the contract in a registry."""
    comps = {component} if isinstance(component, str) else set(component)
    registry = registry if registry is not None else CollectorRegistry()
    out = Collectors(registry=registry)
    for m in CONTRACT_LIST:
        if m.component not in comps:
            continue
        short = m.name.removeprefix(PREFIX)
        if m.type == "counter":
            c = Counter(m.name, m.help, m.labels, registry=registry)
        elif m.type == "gauge":
            c = Gauge(m.name, m.help, m.labels, registry=registry)
        elif m.type == "histogram":
            c = Histogram(m.name, m.help, m.labels, registry=registry,
                          buckets=m.buckets or Histogram.DEFAULT_BUCKETS)
        else:
            c = Info(m.name, m.help, m.labels, registry=registry)
        out.by_name[short] = c
    return out


def histogram_quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile`` over cumulative ``(le, count)`` buckets sorted by ``le``; None
    without data. One reading for every consumer of the contract's histograms (the operator's TTFA
    p99, ``bench serve``'s stage p99s), so each reads what a dashboard over the same buckets shows:
    linear within the bucket holding the rank (from 0 in the first); a rank in ``+Inf`` reads the
    highest finite bound."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return buckets[-1][0]

"""What the four ttsfleet dashboards show: every panel, query and template variable.

Queries use only names from :mod:`ttsfleet.metrics` (ttsfleet's own, and its external section:
dcgm-exporter's and kube-state-metrics' series) and the figure builders of
:mod:`ttsfleet.observability.figures`, which the recording rules share. Filters use template
variables: ``$namespace`` / ``$deployment`` are target labels of inference and fill pods (from
the Kubernetes scrape), the operator's own ``namespace`` / ``deployment`` labels name the
TTSDeployment, ``$gpu_class`` is the catalog class. Multi-value variables with ``All`` = ``.*``
also match series without the label (e.g. Slurm-run fill jobs).
"""

from __future__ import annotations

from ttsfleet.catalog import GpuCatalog
from ttsfleet.observability import figures as fg
from ttsfleet.observability.model import Dashboard, Panel, Row, Target, Variable

RI = "$__rate_interval"
GC = 'gpu_class=~"$gpu_class"'
NS = 'namespace=~"$namespace"'
DEP = 'deployment=~"$deployment"'
POD = f"{NS},{DEP}"
#: The server's full garbage collections (``inference_gc_pause_seconds``' generation 2).
FULL_GC = f'{POD},generation="2"'

DATASOURCE = Variable("datasource", "Data source", "datasource", "prometheus")
GPU_CLASS = Variable("gpu_class", "GPU class", "query", "label_values(ttsfleet_gpus_total, gpu_class)")


def _ts(title: str, desc: str, *targets: Target, **kw: object) -> Panel:
    return Panel(title, "timeseries", targets, desc, **kw)  # type: ignore[arg-type]


def _stat(title: str, desc: str, *targets: Target, **kw: object) -> Panel:
    kw.setdefault("width", 6)
    kw.setdefault("height", 5)
    return Panel(title, "stat", targets, desc, **kw)  # type: ignore[arg-type]


def _q(name: str, metric: str) -> str:
    return f'histogram_quantile({name}, sum by (le) (rate({metric}_bucket{{{POD}}}[{RI}])))'


def _mean_by_stage(metric: str) -> str:
    """Mean seconds per ``stage`` of a histogram over the rate interval."""
    return (f"sum by (stage) (rate({metric}_sum{{{POD}}}[{RI}])) "
            f"/ sum by (stage) (rate({metric}_count{{{POD}}}[{RI}]))")


def fleet(catalog: GpuCatalog) -> Dashboard:
    t = fg.UTILIZATION_TARGET
    alloc = fg.ratio_fleet(fg.gpus_allocated(GC), GC)
    active = fg.ratio_fleet(fg.gpus_active(GC), GC)
    load = fg.ratio_fleet(fg.gpus_load_weighted(RI, catalog, GC), GC)
    pct = {"unit": "percentunit", "thresholds": (t,)}
    return Dashboard(
        "ttsfleet-fleet", "ttsfleet / Fleet utilization",
        "GPU time by workload class; allocated vs active vs load-weighted against the 90 % target.",
        (DATASOURCE, GPU_CLASS),
        (
            Row("Fleet utilization (target 90 %)", (
                _stat("Allocated", "GPUs held by inference, training or fill over all GPUs.",
                      Target(alloc, "allocated"), **pct),
                _stat("Active", "GPUs with work running (what nvidia-smi shows) over all GPUs.",
                      Target(active, "active"), **pct),
                _stat("Load-weighted", "Work done over capacity: inference frames/s over the class "
                      "peak, plus running fill and training jobs, over all GPUs.",
                      Target(load, "load-weighted"), **pct),
                _stat("Idle GPUs", "GPUs no workload holds.",
                      Target(f'sum(ttsfleet_gpus{{workload="idle",{GC}}})', "idle"),
                      thresholds=(1,), higher_is_better=False),
                _ts("Utilization: allocated vs active vs load-weighted",
                    "Three different figures; the line is the 90 % target.",
                    Target(alloc, "allocated"), Target(active, "active"),
                    Target(load, "load-weighted"), width=24, min=0, max=1, **pct),
            )),
            Row("GPU time by workload", (
                _ts("GPUs by workload (fleet)", "GPUs held by each workload class.",
                    Target(f"sum by (workload) (ttsfleet_gpus{{{GC}}})", "{{workload}}"),
                    stacked=True),
                _ts("GPUs by workload and GPU class", "Allocation per GPU class.",
                    Target(f"sum by (gpu_class, workload) (ttsfleet_gpus{{{GC}}})",
                           "{{gpu_class}} {{workload}}"), stacked=True),
                _ts("Active GPUs by workload", "GPUs with work running, per workload class.",
                    Target(f'sum by (workload) (ttsfleet_gpus_active{{workload!="idle",{GC}}})',
                           "{{workload}}"), stacked=True),
                _ts("Utilization per GPU class", "Allocated, active and load-weighted per class.",
                    Target(fg.ratio_by_class(fg.gpus_allocated(GC), GC), "{{gpu_class}} allocated"),
                    Target(fg.ratio_by_class(fg.gpus_active(GC), GC), "{{gpu_class}} active"),
                    Target(fg.ratio_by_class(fg.gpus_load_weighted(RI, catalog, GC), GC),
                           "{{gpu_class}} load-weighted"), min=0, max=1, **pct),
            )),
            Row("Hardware utilization (where dcgm-exporter runs)", (
                _stat("GPU busy (DCGM)", "What the GPUs report (DCGM_FI_DEV_GPU_UTIL: share of "
                      "time a kernel ran), mean over every GPU; empty without dcgm-exporter. "
                      "DCGM series carry no gpu_class: this row ignores the GPU class filter.",
                      Target(fg.dcgm_fleet_busy(), "busy"), **pct),
                _ts("GPU busy by workload (DCGM_FI_DEV_GPU_UTIL)",
                    "Mean hardware utilization of the GPUs each workload class holds (GPU joined "
                    "to its pod, the pod to its ttsfleet.io/workload label).",
                    Target(fg.dcgm_mean_by_workload("DCGM_FI_DEV_GPU_UTIL", 0.01), "{{workload}}"),
                    width=9, min=0, max=1, **pct),
                _ts("SM active by workload (DCGM_FI_PROF_SM_ACTIVE)",
                    "Mean share of cycles an SM has a warp assigned, per workload class.",
                    Target(fg.dcgm_mean_by_workload("DCGM_FI_PROF_SM_ACTIVE"), "{{workload}}"),
                    width=9, unit="percentunit", min=0, max=1),
                _ts("Busy vs allocated GPUs by workload",
                    "Busy GPU-equivalents the hardware reports (sum of utilization / 100) beside "
                    "the GPUs the operator's bookkeeping gives each class: a gap is GPUs held "
                    "but idle.",
                    Target(fg.dcgm_busy_gpus_by_workload(), "{{workload}} busy (DCGM)"),
                    Target(f"sum by (workload) (ttsfleet_gpus{{{fg.NOT_IDLE}}})",
                           "{{workload}} allocated (operator)"), width=12, min=0),
                _ts("GPU utilization by GPU model (DCGM_FI_DEV_GPU_UTIL)", "Per GPU model.",
                    Target("avg by (modelName) (DCGM_FI_DEV_GPU_UTIL)", "{{modelName}}"),
                    width=6, unit="percent", min=0, max=100),
                _ts("SM active by GPU model (DCGM_FI_PROF_SM_ACTIVE)", "Per GPU model.",
                    Target("avg by (modelName) (DCGM_FI_PROF_SM_ACTIVE)", "{{modelName}}"),
                    width=6, unit="percentunit", min=0, max=1),
            )),
        ))


def inference(catalog: GpuCatalog) -> Dashboard:
    ns = Variable("namespace", "Namespace", "query", "label_values(ttsfleet_inference_ready, namespace)")
    dep = Variable("deployment", "Deployment", "query",
                   f"label_values(ttsfleet_inference_ready{{{NS}}}, deployment)")
    op = f"{NS},{DEP},{GC}"
    return Dashboard(
        "ttsfleet-inference", "ttsfleet / Inference",
        "Traffic, time to first audio against the SLO, batching, replicas and scaling.",
        (DATASOURCE, ns, dep, GPU_CLASS),
        (
            Row("Traffic", (
                _ts("Requests/s by status", "Finished requests per second.",
                    Target(f"sum by (status) (rate(ttsfleet_inference_requests_total{{{POD}}}[{RI}]))",
                           "{{status}}"), unit="reqps", width=6),
                _ts("Errors/s by reason", "Failed requests per second.",
                    Target(f"sum by (reason) (rate(ttsfleet_inference_errors_total{{{POD}}}[{RI}]))",
                           "{{reason}}"), unit="reqps", width=6),
                _ts("Frames/s", "Decoded audio frames per second (21.53 frames = 1 s of audio).",
                    Target(f"sum by (deployment) (rate(ttsfleet_inference_frames_total{{{POD}}}[{RI}]))",
                           "{{deployment}}"), width=6),
                _ts("Decode load (frames / replica capacity)",
                    "Load-weighted inference utilization: frames decoded over what the ready "
                    "replicas could decode at their class's peak.",
                    Target(fg.inference_load(RI, catalog, POD, GC), "{{deployment}} {{gpu_class}}"),
                    unit="percentunit", width=6, min=0),
            )),
            Row("Latency against the SLO", (
                _ts("Time to first audio p50 / p99", "The line is the p99 SLO.",
                    Target(_q("0.5", "ttsfleet_inference_ttfa_seconds"), "p50"),
                    Target(_q("0.99", "ttsfleet_inference_ttfa_seconds"), "p99"),
                    unit="s", thresholds=(fg.TTFA_SLO_S,), min=0),
                _ts("Requests within the TTFA SLO", "Share of requests with TTFA within the SLO; "
                    "the line is the objective.",
                    Target(fg.ttfa_good_ratio(RI, POD), "{{deployment}}"),
                    unit="percentunit", thresholds=(fg.TTFA_OBJECTIVE,), width=6),
                _ts("Real-time factor p50 / p99", "Generation time over audio duration (< 1 is "
                    "faster than real time).",
                    Target(_q("0.5", "ttsfleet_inference_realtime_factor"), "p50"),
                    Target(_q("0.99", "ttsfleet_inference_realtime_factor"), "p99"),
                    thresholds=(1.0,), width=6, min=0),
                _ts("Time to first audio by stage (mean)", "Where first audio waits, stacked: to the "
                    "engine's queue, for a slot, prefill, decode to the first codes, codec + encoding "
                    "+ send. The stack is the mean time to first audio.",
                    Target(_mean_by_stage("ttsfleet_inference_ttfa_stage_seconds"), "{{stage}}"),
                    unit="s", stacked=True, min=0, width=8),
                _ts("Decode step interval by phase", "The engine loop's time per decode step, stacked: "
                    "waiting for the GPU (gpu_wait: the GPU sets the pace), queueing steps (launch), "
                    "prefill, and the rest on the host (other). The stack is the step interval.",
                    Target(f"sum by (phase) (rate(ttsfleet_inference_engine_seconds_total{{{POD}}}[{RI}])) / "
                           f"scalar(sum(rate(ttsfleet_inference_batch_size_count{{{POD}}}[{RI}])))",
                           "{{phase}}"),
                    unit="s", stacked=True, min=0, width=8),
                _ts("Decode step GPU time in situ", "The GPU's time per decode step where the engine "
                    "runs, stacked: its decode steps and prefill calls on its CUDA stream (CUDA event "
                    "pairs, so it includes whatever slowed them there, e.g. the codec process's "
                    "kernels beside them under MPS). Set it beside the step interval (the panel to "
                    "its left): when the stack is close to the interval the GPU sets the pace; when "
                    "well below it, the host or gaps between steps do.",
                    Target(f"sum by (work) "
                           f"(rate(ttsfleet_inference_engine_gpu_seconds_total{{{POD}}}[{RI}])) / "
                           f"scalar(sum(rate(ttsfleet_inference_batch_size_count{{{POD}}}[{RI}])))",
                           "{{work}}"),
                    unit="s", stacked=True, min=0, width=8),
                _ts("Event-loop lag (p99)", "How late the server's event loop woke for the timer it "
                    "sets every 10 ms. Every request's first audio leaves through that loop (it parses "
                    "HTTP, hands the codec's audio to each stream and writes it), so its tail is part "
                    "of theirs: tens of ms of lateness say the engine thread (its launches, the "
                    "codec's hand-offs) or the server's own work held the interpreter.",
                    Target(_q("0.99", "ttsfleet_inference_event_loop_lag_seconds"), "p99"),
                    unit="s", min=0),
                _ts("Full garbage collections", "The server's full (generation 2) garbage "
                    "collections: the p99 pause (empty while none ran) and the seconds paused per "
                    "second, their frequency times their length. A full pass stops every thread of "
                    "the server, the engine's decode loop and the event loop sending first audio "
                    "alike, so each pause lands in every request in flight. serve --gc-freeze (the "
                    "default) freezes start-up's objects after the warm-up, keeping that heap out "
                    "of the pass.",
                    Target(f"histogram_quantile(0.99, sum by (le) (rate("
                           f"ttsfleet_inference_gc_pause_seconds_bucket{{{FULL_GC}}}[{RI}])))",
                           "p99 pause"),
                    Target(f"sum(rate(ttsfleet_inference_gc_pause_seconds_sum{{{FULL_GC}}}[{RI}]))",
                           "paused per second"),
                    unit="s", min=0),
            )),
            Row("Batching and queues", (
                _ts("Queue depth", "Requests waiting for a decode slot, per pod.",
                    Target(f"sum by (pod) (ttsfleet_inference_queue_depth{{{POD}}})", "{{pod}}"),
                    width=6),
                _ts("Batch size", "Mean decode batch per step and the running batch now.",
                    Target(f"sum(rate(ttsfleet_inference_batch_size_sum{{{POD}}}[{RI}])) / "
                           f"sum(rate(ttsfleet_inference_batch_size_count{{{POD}}}[{RI}]))",
                           "mean per decode step"),
                    Target(f"avg(ttsfleet_inference_running_batch_size{{{POD}}})", "running (avg)"),
                    width=6),
                _ts("KV slots in use", "KV cache slots used over available.",
                    Target(f"sum(ttsfleet_inference_kv_slots_used{{{POD}}}) / "
                           f"sum(ttsfleet_inference_kv_slots_total{{{POD}}})", "used"),
                    unit="percentunit", width=6, min=0, max=1),
                _ts("Engine GIL wait (probe)", "How long the engine thread waits to get the Python "
                    "interpreter (GIL) back after letting go of it, probed every 16th busy iteration "
                    "of its loop: the engine thread waits behind the server's other threads (HTTP, "
                    "the codec's hand-offs). Microseconds when no other thread wants the interpreter, "
                    "up to the switch interval (5 ms) when one holds it; every torch call and GPU "
                    "wait lets go once, so a mean well above microseconds says those threads slow "
                    "the decode loop.",
                    Target(f"sum(rate(ttsfleet_inference_engine_gil_wait_seconds_sum{{{POD}}}[{RI}])) / "
                           f"sum(rate(ttsfleet_inference_engine_gil_wait_seconds_count{{{POD}}}[{RI}]))",
                           "mean"),
                    Target(_q("0.99", "ttsfleet_inference_engine_gil_wait_seconds"), "p99"),
                    unit="s", width=6, min=0),
            )),
            Row("Replicas and scaling", (
                _ts("Replicas desired vs ready per pool", "From the operator.",
                    Target(f"sum by (pool) (ttsfleet_operator_replicas_desired{{{op}}})",
                           "{{pool}} desired"),
                    Target(f"sum by (pool) (ttsfleet_operator_replicas_ready{{{op}}})",
                           "{{pool}} ready")),
                _stat("Scaling decisions in range", "Decisions that changed the replica count.",
                      Target(f"sum by (direction, reason) (increase(ttsfleet_operator_scaling_decisions"
                             f'_total{{{NS},{DEP},direction!="none"}}[$__range]))',
                             "{{direction}}: {{reason}}"), width=12, height=8),
            )),
        ))


def fill() -> Dashboard:
    ns = Variable("namespace", "Namespace", "query",
                  "label_values(ttsfleet_fill_items_processed_total, namespace)")
    late = fg.CHECKPOINT_LATE_S
    return Dashboard(
        "ttsfleet-fill", "ttsfleet / Fill work",
        "Preemptible data-cleaning jobs on idle GPUs: capacity, throughput and lost work.",
        (DATASOURCE, ns, GPU_CLASS),
        (
            Row("Fill capacity and safety", (
                _stat("Fill pods running", "Fill pods the operator runs.",
                      Target(f"sum(ttsfleet_operator_fill_pods_running{{{GC}}})", "pods")),
                _stat("Fill jobs reporting", "Fill jobs exporting metrics.",
                      Target(f"count(ttsfleet_fill_items_total_in_manifest{{{NS}}})", "jobs")),
                _stat("Lost work (items, must be 0)", "Committed items lost or duplicated.",
                      Target(f"sum(ttsfleet_fill_items_lost_total{{{NS}}})", "lost"),
                      thresholds=(1,), higher_is_better=False),
                _stat("Evictions stuck past grace", "Fill pods still terminating past their grace.",
                      Target(f"sum(ttsfleet_operator_eviction_stuck{{{GC}}})", "stuck"),
                      thresholds=(1,), higher_is_better=False),
                _ts("Fill pods running per GPU class", "From the operator.",
                    Target(f"sum by (gpu_class) (ttsfleet_operator_fill_pods_running{{{GC}}})",
                           "{{gpu_class}}"), stacked=True),
                _ts("Fill admissions and evictions (10 min)", "Pods started on idle GPUs and pods "
                    "evicted to make room for inference.",
                    Target(f"sum by (gpu_class) (increase(ttsfleet_operator_fill_admissions_total"
                           f"{{{GC}}}[10m]))", "{{gpu_class}} admitted"),
                    Target(f"sum by (gpu_class, reason) (increase(ttsfleet_operator_fill_evictions_total"
                           f"{{{GC}}}[10m]))", "{{gpu_class}} evicted: {{reason}}")),
            )),
            Row("Throughput", (
                _ts("Items/s per job", "Manifest items finished per second.",
                    Target(f"sum by (fill_job) (rate(ttsfleet_fill_items_processed_total{{{NS}}}[{RI}]))",
                           "{{fill_job}}"), stacked=True, width=8),
                _ts("Audio seconds processed / s", "Input audio cleaned per second of wall time.",
                    Target(f"sum(rate(ttsfleet_fill_audio_seconds_processed_total{{{NS}}}[{RI}]))",
                           "audio s/s"), width=8),
                _ts("Rejects/s by reason", "Items rejected by a cleaning stage.",
                    Target(f"sum by (reason) (rate(ttsfleet_fill_items_rejected_total{{{NS}}}[{RI}]))",
                           "{{reason}}"), width=8),
                _ts("Manifest progress", "Items finished over items in the job's shard.",
                    Target(f"sum by (fill_job) (ttsfleet_fill_items_processed_total{{{NS}}}) / "
                           f"sum by (fill_job) (ttsfleet_fill_items_total_in_manifest{{{NS}}})",
                           "{{fill_job}}"), unit="percentunit", min=0, width=8),
                _ts("Stage time p99", "Per-item time in each cleaning stage.",
                    Target(f"histogram_quantile(0.99, sum by (stage, le) "
                           f"(rate(ttsfleet_fill_stage_seconds_bucket{{{NS}}}[{RI}])))", "{{stage}}"),
                    unit="s", min=0, width=8),
                _ts("Batch-stage GPU time / wall", "Share of wall time the job's batch stages (codec "
                    "tokens, features) kept its GPU working, from CUDA events in the job itself: "
                    "the job's own busy figure, also on Slurm nodes without dcgm-exporter.",
                    Target(f"sum by (fill_job) (rate(ttsfleet_fill_batch_gpu_seconds_total{{{NS}}}"
                           f"[{RI}]))", "{{fill_job}}"), unit="percentunit", min=0, max=1, width=8),
            )),
            Row("Preemption", (
                _ts("Seconds since last checkpoint", f"Work at risk on SIGKILL; the line is the "
                    f"alert threshold ({late:g} s).",
                    Target(f"max by (fill_job) (time() - ttsfleet_fill_last_checkpoint_timestamp_seconds"
                           f"{{{NS}}})", "{{fill_job}}"), unit="s", thresholds=(late,), min=0),
                _stat("Preemptions in range", "Fill jobs that resumed after a preemption, and "
                      "operator evictions by reason.",
                      Target(f"sum(increase(ttsfleet_fill_preemptions_survived_total{{{NS}}}[$__range]))",
                             "jobs resumed after preemption"),
                      Target(f"sum by (reason) (increase(ttsfleet_operator_fill_evictions_total{{{GC}}}"
                             f"[$__range]))", "evicted: {{reason}}"), width=12, height=8),
            )),
        ))


def slurm() -> Dashboard:
    return Dashboard(
        "ttsfleet-slurm", "ttsfleet / Slurm",
        "Slurm partitions: allocated and idle GPUs, pending jobs, preemptions and requeues.",
        (DATASOURCE, GPU_CLASS),
        (
            Row("GPUs", (
                _ts("Allocated GPUs per partition", "GPUs allocated to running jobs.",
                    Target(f"sum by (partition) (ttsfleet_slurm_gpus_allocated{{{GC}}})",
                           "{{partition}}"), stacked=True),
                _ts("Idle GPUs per GPU class", "Configured GPUs no job holds (partitions share nodes).",
                    Target(f"sum by (gpu_class) (ttsfleet_slurm_gpus_idle{{{GC}}})", "{{gpu_class}}")),
            )),
            Row("Jobs", (
                _ts("Pending jobs per partition", "Jobs waiting in the queue.",
                    Target("sum by (partition) (ttsfleet_slurm_jobs_pending)", "{{partition}}"), width=9),
                _ts("Running jobs per partition", "Jobs running.",
                    Target("sum by (partition) (ttsfleet_slurm_jobs_running)", "{{partition}}"), width=9),
                _stat("Exporter up", "1 when the exporter's last Slurm query succeeded.",
                      Target("min(ttsfleet_slurm_up)", "up"), thresholds=(1,), height=8),
                _ts("Preemptions and requeues (10 min)", "Jobs preempted and requeued.",
                    Target("sum by (partition) (increase(ttsfleet_slurm_preemptions_total[10m]))",
                           "{{partition}} preempted"),
                    Target("sum by (partition) (increase(ttsfleet_slurm_requeues_total[10m]))",
                           "{{partition}} requeued")),
                _ts("Fill shards submitted (10 min)", "Shards the fill agent submitted.",
                    Target(f"sum by (gpu_class) (increase(ttsfleet_slurm_fill_submissions_total{{{GC}}}"
                           f"[10m]))", "{{gpu_class}}")),
            )),
        ))


def all_dashboards(catalog: GpuCatalog) -> list[Dashboard]:
    """Every dashboard for the run's catalog (its classes' capacities are in the load panels)."""
    return [fleet(catalog), inference(catalog), fill(), slurm()]

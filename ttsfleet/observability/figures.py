"""The fleet's headline figures as PromQL, written once for both panels and recording rules.

Three utilization figures, never shown as one another (definitions from the simulator):

* **allocated** - GPUs held by a workload (inference, training or fill) over all GPUs
  (``ttsfleet_gpus{workload!="idle"}`` / ``ttsfleet_gpus_total``).
* **active** - GPUs with work running (an inference replica with a request in flight, a running
  fill or training job; what nvidia-smi shows) over all GPUs (``ttsfleet_gpus_active``).
* **load-weighted** - work done over capacity, in GPU-equivalents over all GPUs. A running fill
  or training job counts as one GPU of work. An inference GPU counts as the frames its replicas
  decoded per second divided by the peak frames/s of its GPU class from the catalog
  (``GpuClass.capacity.peak_frames_per_s``), so an inference replica at half its batch
  throughput is half a GPU of work. Frames are attributed to a GPU class by joining each pod's
  ``ttsfleet_inference_frames_total`` with its ``ttsfleet_inference_build_info{gpu_class}``.

Beside them, where NVIDIA's dcgm-exporter runs, the **hardware** figure: what the GPUs report
(``DCGM_FI_DEV_GPU_UTIL``, NVML's share of time a kernel ran; ``DCGM_FI_PROF_SM_ACTIVE``), split
by workload class by joining each GPU's pod (dcgm-exporter's Kubernetes pod mapping) to the pod's
``ttsfleet.io/workload`` label (kube-state-metrics' ``kube_pod_labels``). GPUs no labelled pod
holds stay out of the split but count in the fleet mean.

The SLO figure is the fraction of requests whose time to first audio is within
``AutoscaleConfig.ttfa_p99_slo_s`` (a bucket boundary of the TTFA histogram); the p99 objective
allows 1 % of requests above it. Every function takes extra label matchers (``m``) so panels can
add template-variable filters and rules can use none.
"""

from __future__ import annotations

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, FillPolicyConfig
from ttsfleet.metrics import KSM_WORKLOAD_LABEL, LATENCY_BUCKETS

#: The fleet utilization target drawn on the dashboards and used by the below-target alert.
UTILIZATION_TARGET = 0.9
#: TTFA SLO threshold (seconds) and objective (fraction of requests at or below it).
TTFA_SLO_S = AutoscaleConfig().ttfa_p99_slo_s
TTFA_OBJECTIVE = 0.99
#: A fill job that has not checkpointed for this many checkpoint intervals is alerted on.
CHECKPOINT_INTERVALS_LATE = 5
CHECKPOINT_LATE_S = CHECKPOINT_INTERVALS_LATE * FillPolicyConfig().checkpoint_interval_s

if TTFA_SLO_S not in LATENCY_BUCKETS:  # pragma: no cover - guarded by tests
    raise RuntimeError(f"TTFA SLO {TTFA_SLO_S}s is not a TTFA histogram bucket boundary")


def le_label(v: float) -> str:
    """Bucket boundary as prometheus-client writes it in the ``le`` label."""
    return repr(float(v))


NOT_IDLE = 'workload!="idle"'
JOBS = 'workload=~"fill|training"'


def _sel(*parts: str) -> str:
    inner = ",".join(p for p in parts if p)
    return "{" + inner + "}" if inner else ""


def gpus_total(m: str = "") -> str:
    return f"sum by (gpu_class) (ttsfleet_gpus_total{_sel(m)})"


def gpus_allocated(m: str = "") -> str:
    return f'sum by (gpu_class) (ttsfleet_gpus{_sel(NOT_IDLE, m)})'


def gpus_active(m: str = "") -> str:
    return f'sum by (gpu_class) (ttsfleet_gpus_active{_sel(NOT_IDLE, m)})'


def inference_frames_rate(window: str, m_pod: str = "", m_class: str = "") -> str:
    """Frames/s decoded per namespace, deployment and GPU class (joined from build_info)."""
    return ("sum by (namespace, deployment, gpu_class) ("
            f"rate(ttsfleet_inference_frames_total{_sel(m_pod)}[{window}])"
            " * on (namespace, pod) group_left (gpu_class) "
            f"ttsfleet_inference_build_info{_sel(m_pod, m_class)})")


def inference_replicas_ready(m_pod: str = "", m_class: str = "") -> str:
    """Ready inference replicas per namespace, deployment and GPU class, from the pods themselves."""
    return ("sum by (namespace, deployment, gpu_class) ("
            f"ttsfleet_inference_ready{_sel(m_pod)}"
            " * on (namespace, pod) group_left (gpu_class) "
            f"ttsfleet_inference_build_info{_sel(m_pod, m_class)})")


def frame_capacity_per_gpu(catalog: GpuCatalog) -> str:
    """Peak decode frames/s of one replica per GPU class, as a vector built from the run's catalog
    (a class missing here reads 0 in every load figure)."""
    parts = [f'label_replace(vector({catalog.get(n).capacity.peak_frames_per_s:g}), '
             f'"gpu_class", "{n}", "", "")' for n in catalog.names()]
    return "(" + " or ".join(parts) + ")"


def inference_load(window: str, catalog: GpuCatalog, m_pod: str = "", m_class: str = "") -> str:
    """Load-weighted inference utilization: frames decoded over what the ready replicas could."""
    return (f"{inference_frames_rate(window, m_pod, m_class)}"
            " / on (namespace, deployment, gpu_class) ("
            f"{inference_replicas_ready(m_pod, m_class)}"
            f" * on (gpu_class) group_left () {frame_capacity_per_gpu(catalog)})")


def gpus_load_weighted(window: str, catalog: GpuCatalog, m: str = "") -> str:
    """GPU-equivalents of work per GPU class (inference frames over capacity + fill + training)."""
    zero = f"0 * {gpus_total(m)}"
    inference = (f"sum by (gpu_class) ({inference_frames_rate(window, '', m)})"
                 f" / on (gpu_class) {frame_capacity_per_gpu(catalog)}")
    jobs = f'sum by (gpu_class) (ttsfleet_gpus_active{_sel(JOBS, m)})'
    return f"(({inference}) or {zero}) + on (gpu_class) (({jobs}) or {zero})"


def ratio_by_class(numerator: str, m: str = "") -> str:
    return f"({numerator}) / on (gpu_class) {gpus_total(m)}"


def ratio_fleet(numerator: str, m: str = "") -> str:
    return f"sum({numerator}) / sum({gpus_total(m)})"


def ttfa_good_ratio(window: str, m_pod: str = "") -> str:
    """Fraction of requests with time to first audio within the SLO, per namespace/deployment."""
    le = f'le="{le_label(TTFA_SLO_S)}"'
    return ("sum by (namespace, deployment) ("
            f"rate(ttsfleet_inference_ttfa_seconds_bucket{_sel(le, m_pod)}[{window}]))"
            " / sum by (namespace, deployment) ("
            f"rate(ttsfleet_inference_ttfa_seconds_count{_sel(m_pod)}[{window}]))")


def pod_workload() -> str:
    """One series per labelled pod: ``{namespace, pod, label_ttsfleet_io_workload}`` = 1."""
    return (f"max by (namespace, pod, {KSM_WORKLOAD_LABEL}) "
            f'(kube_pod_labels{{{KSM_WORKLOAD_LABEL}!=""}})')


def dcgm_with_workload(metric: str, m: str = "") -> str:
    """A DCGM per-GPU series with the holding pod's workload class as a ``workload`` label."""
    held = _sel('pod!=""', m)
    joined = (f"{metric}{held} * on (namespace, pod) group_left ({KSM_WORKLOAD_LABEL}) "
              f"{pod_workload()}")
    return f'label_replace({joined}, "workload", "$1", "{KSM_WORKLOAD_LABEL}", "(.+)")'


def dcgm_mean_by_workload(metric: str, scale: float = 1.0, m: str = "") -> str:
    """Mean of a DCGM gauge over the GPUs of each workload class (``scale`` 0.01: % → ratio)."""
    factor = f" * {scale:g}" if scale != 1.0 else ""
    return f"avg by (workload) ({dcgm_with_workload(metric, m)}){factor}"


def dcgm_busy_gpus_by_workload(m: str = "") -> str:
    """Busy GPU-equivalents per workload class: the sum of GPU utilization / 100."""
    return f'sum by (workload) ({dcgm_with_workload("DCGM_FI_DEV_GPU_UTIL", m)}) / 100'


def dcgm_fleet_busy(m: str = "") -> str:
    """GPU busy over the whole fleet (every GPU dcgm-exporter sees, held or not), 0-1."""
    return f"avg(DCGM_FI_DEV_GPU_UTIL{_sel(m)}) / 100"

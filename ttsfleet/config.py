"""Config models shared by every component (pydantic, camelCase on the wire).

The same models back the operator's CRD schemas, the Slurm agent's flags and the simulator's
options, so a knob means the same thing everywhere. Field names are snake_case in Python and
camelCase in manifests (``minReplicas``); both spellings are accepted on input.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts import fill as fill_contract


class WireModel(BaseModel):
    """Base for models that appear in manifests: camelCase aliases, unknown fields rejected."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True)


class AutoscaleConfig(WireModel):
    """Autoscaling targets for one TTSDeployment (all pools share them)."""

    # 40: also the simulator's scenario (Scenario.autoscale), derived there from our served H200
    # curve (2026-12-04, 128 slots: real-time headroom, RTF p99 <= 0.5, up to c=64 in flight).
    target_in_flight_per_replica: float = Field(
        default=40.0, gt=0,
        description="In-flight requests one reference replica (the fastest GPU class) should carry;"
                    " slower classes get a proportionally smaller target.")
    ttfa_p99_slo_s: float = Field(default=0.5, gt=0, description="time-to-first-audio p99 SLO")
    stable_window_s: float = Field(default=60.0, gt=0,
                                   description="load is averaged over this window")
    panic_window_s: float = Field(default=15.0, gt=0,
                                  description="short window that detects bursts")
    panic_threshold: float = Field(default=1.5, gt=1.0,
                                   description="enter panic when the panic-window load needs this "
                                               "many times the ready capacity")
    scale_down_stabilization_s: float = Field(
        default=300.0, ge=0, description="scale down only to the highest recommendation seen in "
                                         "this window")
    max_scale_up_rate: float = Field(default=4.0, gt=1.0,
                                     description="at most this many times the ready replicas")
    max_scale_down_rate: float = Field(default=2.0, gt=1.0,
                                       description="at least ready/rate replicas are kept")
    queue_depth_per_replica: float = Field(
        default=4.0, ge=0, description="queued requests per replica that count as SLO pressure")
    # Burst handling (2026-12-01, benchmarks/simulate/): a replica ordered now serves only after
    # its class's model_load_s, so bursts that grow faster are met by spare capacity or by
    # scaling ahead. Both default off here, keeping a TTSDeployment's behaviour; the simulator's
    # scenario sets the head-room its bursty trace measured.
    burst_headroom: float = Field(
        default=0.0, ge=0, le=4,
        description="spare capacity as a share of the load: what the ready replicas absorb of a "
                    "burst while new ones load (model_load_s); 0: none")
    forecast: bool = Field(
        default=False,
        description="also size replicas for the load the rising trend expects when a replica "
                    "ordered now is ready (reason forecast)")
    forecast_horizon_s: float | None = Field(
        default=None, gt=0,
        description="how far ahead the forecast looks; null: each pool's GPU class "
                    "model_load_s (catalog)")
    forecast_window_s: float = Field(
        default=60.0, gt=0, description="history the load trend is fitted over (least squares)")
    forecast_min_growth: float = Field(
        default=0.5, ge=0,
        description="the forecast acts only when it expects at least this share more load than "
                    "the step sizes for: a burst's ramp, not the noise of a steady load")
    # Recurring bursts (2026-12-04d, benchmarks/simulate/: azure-code-1h, a burst every few
    # minutes that ends within seconds): each panic scaled up, the stabilization window let the
    # replicas go before the next burst, which then found them loading (p99 TTFA over the SLO) and
    # evicted the fill admitted meanwhile. Off here (a TTSDeployment's behaviour); the simulator's
    # scenario sets it.
    burst_hold_s: float = Field(
        default=0.0, ge=0,
        description="after a panic, scale down only to the highest recommendation of this many "
                    "seconds (instead of scaleDownStabilizationS), until that long passes "
                    "without a panic: replicas scaled up for a burst stay warm while bursts "
                    "recur; 0: off")

    @model_validator(mode="after")
    def _windows(self) -> AutoscaleConfig:
        if self.panic_window_s > self.stable_window_s:
            raise ValueError("panicWindowS must not exceed stableWindowS")
        return self


class PoolSpec(WireModel):
    """One GPU pool of a TTSDeployment: a GPU class and its replica bounds."""

    name: str = Field(default="", pattern=r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                      description="pool name; defaults to the GPU class")
    gpu_class: str = Field(description=f"catalog name: {GpuCatalog.default().names_text()}")
    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=8, ge=0)
    weight: float = Field(default=1.0, gt=0, description="share of the load this pool takes")
    target_in_flight_per_replica: float | None = Field(
        default=None, gt=0, description="override the class-scaled target for this pool")

    @model_validator(mode="after")
    def _bounds(self) -> PoolSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"minReplicas ({self.min_replicas}) > maxReplicas ({self.max_replicas})")
        return self

    @property
    def key(self) -> str:
        return self.name or self.gpu_class


class FillPolicyConfig(WireModel):
    """How idle GPUs are filled and handed back."""

    min_free_gpus: int = Field(default=0, ge=0,
                               description="GPUs per class always left empty for inference")
    headroom_fraction: float = Field(
        default=0.0, ge=0, le=1,
        description="extra empty GPUs as a fraction of the GPUs inference holds")
    eviction_deadline_s: float = Field(
        default=120.0, gt=0,
        description="how far ahead the forecast looks: grace period plus pod start")
    forecast_window_s: float = Field(default=300.0, gt=0,
                                     description="history used to estimate the demand trend")
    max_fill_gpus: int | None = Field(default=None, ge=0,
                                      description="cap on GPUs running fill work per class")
    hold_while_training_pending: bool = Field(
        default=True, description="admit no fill while training jobs wait for GPUs")
    scheduler_preempts_training: bool = Field(
        default=False,
        description="the scheduler preempts fill for pending training by itself (Slurm "
                    "partition_prio): evict only for inference and headroom")
    grace_period_s: float = Field(default=float(fill_contract.GRACE_PERIOD_S), gt=0,
                                  description="SIGTERM to SIGKILL for fill pods and jobs")
    checkpoint_interval_s: float = Field(default=fill_contract.CHECKPOINT_INTERVAL_S, gt=0,
                                         description="seconds between a fill job's checkpoints")
    # Admission that expects to stay (issue 24): a GPU that inference needed a moment ago is
    # needed again soon on bursty traffic, and a fill job admitted onto it pays its start-up for
    # nothing. Off by default, so a FillJob decides as before; the simulator's scenario sets them.
    admission_lookback_s: float = Field(
        default=0.0, ge=0,
        description="admit fill only onto GPUs inference has not needed for this long (its "
                    "demand peak over the window is reserved); 0: off")
    admission_horizon_s: float = Field(
        default=0.0, ge=0,
        description="an admitted fill job should keep its GPU at least this long (start-up plus "
                    "first checkpoint): admission reserves the demand trend's growth over the "
                    "eviction deadline plus this; 0: the eviction deadline only")


#: Co-location interference, measured 2026-12-01 on one H200 with two plain processes (no MPS, no
#: CUDA stream priorities): the served S2 Pro path at c=16 decoded 692 frames/s alone (RTF p50
#: 0.39) and 549 beside a float32 codec-encode loop (RTF p50 0.65), which kept 440 of the 506
#: audio-s/s it encodes alone. Source: /work/shared/baselines/README.md ("The served path and
#: its levers", main at 398c193) and issue 24. Priorities or MPS should cost less; not measured.
COLOCATION_MEASURED_INFERENCE_THROUGHPUT = 549 / 692
COLOCATION_MEASURED_INFERENCE_LATENCY = 0.65 / 0.39
COLOCATION_MEASURED_FILL_THROUGHPUT = 440 / 506


class ColocationConfig(WireModel):
    """Fill work beside a serving replica on the replica's own GPU: when it is allowed, and what
    it costs (the interference). The defaults are the one measurement (the constants above).

    Warm replicas kept for bursts idle at low batch; a fill job that inference is bound beside
    (instead of evicting it) turns that idle time into work, at a measured cost to the replica.
    :func:`ttsfleet.policy.colocation_limit` decides up to which load the trade pays; only the
    simulator carries it out today (the operator cannot bind two pods to one GPU yet).
    """

    enabled: bool = Field(default=False, description="co-locate fill beside serving replicas")
    max_rtf: float = Field(
        default=0.5, gt=0,
        description="a co-located replica's real-time factor (curve's, times the latency cost) "
                    "must stay at or below this")
    max_ttfa_s: float | None = Field(
        default=None, gt=0,
        description="a co-located replica's time to first audio (curve's, times the latency "
                    "cost) must stay at or below this; null: the curve's value at the pool's "
                    "in-flight target, so no request waits longer than at the sizing point")
    # Not measured: the design (issue 24) is a co-tenant at the lowest CUDA priority that yields
    # within a decode step, i.e. within the simulator's 1 s resolution (0). A co-tenant paused
    # by a node agent polling the server takes its poll interval (benchmarks/simulate: 1 s and
    # 15 s cost p99 TTFA on long-request traces).
    yield_s: float = Field(
        default=0.0, ge=0,
        description="seconds a co-tenant keeps running after its replica's load exceeds the "
                    "co-location limit, before it yields")
    inference_throughput: float = Field(
        default=COLOCATION_MEASURED_INFERENCE_THROUGHPUT, gt=0, le=1,
        description="share of its frames/s a replica keeps beside a fill co-tenant")
    inference_latency: float = Field(
        default=COLOCATION_MEASURED_INFERENCE_LATENCY, ge=1,
        description="factor on a co-located replica's time to first audio and real-time factor")
    fill_throughput: float = Field(
        default=COLOCATION_MEASURED_FILL_THROUGHPUT, gt=0, le=1,
        description="share of an exclusive fill job's work a co-tenant does")

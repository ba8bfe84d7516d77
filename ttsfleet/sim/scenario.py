"""Simulation scenarios: the fleet, the deployment, training work, fill work and timing.

The embedded default is a mixed fleet of 32 H200 + 32 RTX 5090 serving one TTS deployment
under a deterministic diurnal trace, sized so that the inference-only baseline sits near the
~50% GPU utilization the source write-up starts from. Every GPU-class fact (capacity, model load
time, memory) comes from the run's catalog, which the scenario carries.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, ColocationConfig, FillPolicyConfig, PoolSpec
from ttsfleet.contracts.serving import DEFAULT_QUEUE_PER_SLOT
from ttsfleet.errors import UserError

#: The embedded default fleet of `ttsfleet simulate`.
DEFAULT_FLEET = {"h200": 32, "rtx5090": 32}

#: Share of its GPU's time a running fill job keeps the GPU busy (NVML utilization), used for
#: every class without its own figure. Measured: ``ttsfleet fill run`` with the default stages plus
#: codec tokenization on one H200, 97.4% mean NVML busy over the steady window (95.2% counting
#: start-up, which the simulator models separately as the fill start time), 2026-12-01,
#: benchmarks/fill_jobs/fill_gpu_2026-12-01.json. No other class was measured.
FILL_BUSY_FRACTION = 0.97


class TrainingJob(BaseModel):
    """A training job: arrives at ``submit_s`` and holds ``nodes`` whole nodes for ``duration_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_class: str
    nodes: int = Field(default=1, ge=1, description="whole nodes (all their GPUs)")
    submit_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class FillWorkload(BaseModel):
    """How fill jobs behave in the simulated fleet (figures from `ttsfleet fill run`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_s: float = Field(default=20.0, ge=0,
                           description="pod start until the job does work (restart cost per admission)")
    # Measured: `ttsfleet fill run` (default stages) answers SIGTERM with a committed checkpoint
    # and exit 99 in 0.67-0.78 s on a loaded 2-core machine (5 runs, 2026-11-30); 1 s rounds up.
    stop_s: float = Field(default=1.0, ge=0,
                          description="SIGTERM until the checkpoint is written and the process exits")
    item_s: float = Field(default=6.0, gt=0,
                          description="seconds per item; an eviction abandons the current item")
    # Measured: benchmarks/fill_jobs/RESULTS.md, 2026-11-30 "default" run: 1.20% commit overhead of
    # 7.6 s (200 items at 26.4 items/s) over 2 commits = 0.045 s per checkpoint.
    checkpoint_cost_s: float = Field(default=0.045, ge=0,
                                     description="GPU-idle seconds per checkpoint written")
    # A choice, not a measurement: one early checkpoint 10 s into a job's work (the cadence
    # `ttsfleet fill run --checkpoint-every-seconds 10` was benchmarked at, benchmarks/fill_jobs),
    # so a job evicted young has made its start-up durable. Costs one checkpoint write per job.
    first_checkpoint_s: float | None = Field(
        default=10.0, gt=0,
        description="a job's first checkpoint this long after it starts working, then every "
                    "checkpoint interval; null: the first at one interval")
    busy_fraction: dict[str, float] = Field(
        default_factory=dict,
        description="per GPU class: share of the GPU a running fill job keeps busy (NVML); "
                    f"classes not named use FILL_BUSY_FRACTION ({FILL_BUSY_FRACTION})")

    @field_validator("busy_fraction")
    @classmethod
    def _fractions(cls, v: dict[str, float]) -> dict[str, float]:
        for name, f in v.items():
            if not 0 < f <= 1:
                raise ValueError(f"fill busy fraction for {name} must be in (0, 1], got {f}")
        return v

    def busy_for(self, gpu_class: str) -> float:
        return self.busy_fraction.get(gpu_class, FILL_BUSY_FRACTION)


class Scenario(BaseModel):
    """Everything one simulation run needs besides the trace."""

    model_config = ConfigDict(extra="forbid")

    catalog: GpuCatalog = Field(default_factory=GpuCatalog.default,
                                description="the run's GPU classes; pass it, never re-read the built-in one")
    fleet: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_FLEET))
    pools: list[PoolSpec] = Field(default_factory=list, description="empty: one pool per class")
    # Bursts outrun a replica's model load (96 s on the H200): the simulated deployment keeps 20%
    # spare capacity (benchmarks/simulate/README.md, bursty trace and the burst-rule ablation,
    # 2026-12-01; the trend forecast added fill churn there and no p99). AutoscaleConfig's own
    # defaults (both off) keep a TTSDeployment's behaviour. Sizing: replicas carry AutoscaleConfig's
    # default target, 40 in flight. The rule it was derived by: size below the concurrency where our
    # served H200 curve's first audio reaches the 500 ms SLO. On 2026-12-01's curve that was near
    # 25.5 (0.35 s at 8, 0.83 s at 64), and replicas were sized for 16 (0.63 of it). On the
    # 2026-12-02 curve first audio stayed under the SLO wherever a replica admitted requests (64
    # slots), and the limit was the slot count: 0.63 x 64 = 40. On 2026-12-04's (catalog,
    # _SERVED_H200: 128 slots; run5, run10 with the channels-last codec, then run15 on the final
    # defaults) first audio stays under it to c=128 (run15: p99 at most 247 ms, at c=128; run10: 350
    # ms, at c=64), but real-time headroom (RTF p99 <= 0.5) holds at c=64 (run15: 0.445; run10:
    # 0.450; run5: 0.463) and not at c=128 (0.754; 0.793; 0.792): the limit is 64 measured in-flight
    # streams (run15's curve carries it as slo_concurrency 64), and 0.63 x 64 = 40 still
    # (tests/core/test_simulator.py reads the recorded run).
    autoscale: AutoscaleConfig = AutoscaleConfig(burst_headroom=0.2)
    # The simulated kube-scheduler preempts fill for pending training by itself (the chart's
    # PriorityClasses: training above fill), so the policy evicts only for inference and headroom.
    # Admission expects to stay: no fill on a GPU inference (or the eviction forecast) wanted in
    # the last 300 s, one scale-down window (benchmarks/simulate/README.md, admission ablation,
    # 2026-12-01: fill lost on the bursty trace 1.51% -> 0.97%, flat 1.23% -> 0.49%, default
    # 0.88% -> 0.36%, for 2.5-6 points of GPU-busy). FillPolicyConfig's own default (0, off)
    # keeps a FillJob's behaviour.
    fill_policy: FillPolicyConfig = FillPolicyConfig(scheduler_preempts_training=True,
                                                     admission_lookback_s=300.0)
    fill: FillWorkload = FillWorkload()
    # Fill beside serving replicas on their GPUs: an option, off by default (the operator cannot
    # place it yet); the interference cost is the one measurement (ColocationConfig's defaults).
    colocation: ColocationConfig = ColocationConfig()
    training: list[TrainingJob] = Field(default_factory=list)
    gpus_per_node: int = Field(default=8, ge=1,
                               description="GPUs per node (a class's last node may be smaller)")
    # Estimate, not measured here: kubelet reports the container gone, the device plugin frees
    # the GPU and kube-scheduler binds the next pod (typically 1-3 s on an idle control plane).
    release_s: float = Field(default=2.0, ge=0,
                             description="process exit until another pod can be bound to the GPU")
    policy_interval_s: float = Field(default=15.0, gt=0,
                                     description="operator cadence: autoscaler and fill timers")
    # The server's own default (inference/serve_config.py: max_queue 0 = 4 x max_running_requests,
    # 512 on the H200's 128 slots, 256 on an RTX 5090's 64); 64 for every class before
    # 2026-12-04d, when it was also applied before free slots admitted a second's arrivals.
    queue_per_replica: int | None = Field(
        default=None, ge=0, description="bounded server queue per replica (requests waiting "
                                        "beyond its free decode slots); beyond it 429; null: "
                                        "the server's default, 4 x the class's max_running_requests")
    observe_nodes: bool = Field(
        default=True, description="the adapter shows the policy the node topology (node-aware "
                                  "victims and placement); off: node-blind, as before 2026-12-01")
    # Assumed (not measured here): a data-parallel training step keeps its GPUs ~95% busy.
    training_busy_fraction: float = Field(default=0.95, gt=0, le=1)
    seed: int = 0

    @field_validator("fleet")
    @classmethod
    def _counts(cls, fleet: dict[str, int]) -> dict[str, int]:
        for name, n in fleet.items():
            if n < 0:
                raise ValueError(f"GPU count for {name} must be >= 0, got {n}")
        if sum(fleet.values()) == 0:
            raise ValueError("the fleet has no GPUs")
        return fleet

    @model_validator(mode="after")
    def _fits(self) -> Scenario:
        for name in self.fleet:
            if name not in self.catalog.classes:
                raise ValueError(f"unknown GPU class {name!r} (known: {', '.join(self.catalog.names())})")
        if not self.pools:
            self.pools = default_pools_for(self.fleet, self.catalog)
        for p in self.pools:
            if p.gpu_class not in self.fleet:
                raise ValueError(f"pool {p.key} uses GPU class {p.gpu_class!r} absent from the fleet")
        for j in self.training:
            if j.gpu_class not in self.fleet:
                raise ValueError(f"training job uses GPU class {j.gpu_class!r} absent from the fleet")
            if j.nodes > len(self.node_sizes(j.gpu_class)):
                raise ValueError(f"training job wants {j.nodes} {j.gpu_class} node(s), the fleet has "
                                 f"{len(self.node_sizes(j.gpu_class))}")
        return self

    def queue_for(self, gpu_class: str) -> int:
        """Requests one replica of ``gpu_class`` queues beyond its free decode slots before 429."""
        if self.queue_per_replica is not None:
            return self.queue_per_replica
        return DEFAULT_QUEUE_PER_SLOT * self.catalog.get(gpu_class).serving.max_running_requests

    @property
    def checkpoint_overhead(self) -> float:
        """Share of a running fill job's time spent writing checkpoints (the GPU idles)."""
        return self.fill.checkpoint_cost_s / self.fill_policy.checkpoint_interval_s

    def fill_busy(self, gpu_class: str) -> float:
        """GPU busy fraction of one running fill job of a class, checkpoint writes taken out."""
        return self.fill.busy_for(gpu_class) * (1 - self.checkpoint_overhead)

    def since_checkpoint(self, ran: float) -> float:
        """Seconds since the last checkpoint of a job that has worked ``ran`` seconds."""
        interval, first = self.fill_policy.checkpoint_interval_s, self.fill.first_checkpoint_s
        if first is None or first >= interval:
            return ran % interval
        if ran < first:
            return ran
        return (ran - first) % interval

    def at_risk(self, state: str, admitted: float, run_start: float, t: float) -> float:
        """Work at risk of a fill process (what the policy ranks victims by), through the one
        definition every adapter uses (:func:`ttsfleet.contracts.fill.work_at_risk`): seconds since
        its last checkpoint on the simulated schedule, or since it was admitted (start-up
        included) while it has none."""
        from ttsfleet.contracts.fill import work_at_risk

        if state != "running":
            return work_at_risk(t, None, admitted_at=admitted)
        ran = t - run_start
        first = self.fill.first_checkpoint_s
        if ran < (first if first is not None else self.fill_policy.checkpoint_interval_s):
            return work_at_risk(t, run_start, admitted_at=admitted)
        return work_at_risk(t, run_start, t - self.since_checkpoint(ran), admitted_at=admitted)

    def cotenant_at_risk(self, co, t: float) -> float:  # noqa: ANN001 - fleet.CoTenant
        return self.at_risk(co.state, co.admitted, co.run_start, t)

    def node_sizes(self, gpu_class: str) -> list[int]:
        """GPUs of each node of a class: full nodes, then the remainder."""
        n, size = self.fleet.get(gpu_class, 0), self.gpus_per_node
        return [size] * (n // size) + ([n % size] if n % size else [])


def parse_fleet(text: str, catalog: GpuCatalog) -> dict[str, int]:
    """Parse ``"h200=32,rtx5090=32"`` into a fleet mapping, validating names and counts."""
    fleet: dict[str, int] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition("=")
        name = name.strip()
        if not sep:
            raise UserError(f"fleet entry {part!r} must look like CLASS=COUNT")
        try:
            catalog.get(name)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        try:
            n = int(count)
        except ValueError:
            raise UserError(f"fleet count for {name} must be an integer, got {count!r}") from None
        if n < 0:
            raise UserError(f"fleet count for {name} must be >= 0, got {n}")
        fleet[name] = fleet.get(name, 0) + n
    if not fleet or sum(fleet.values()) == 0:
        raise UserError("fleet is empty")
    return fleet


def default_pools_for(fleet: dict[str, int], catalog: GpuCatalog) -> list[PoolSpec]:
    """One pool per GPU class, weighted by the class's share of the fleet's throughput."""
    present = {name: catalog.get(name) for name, n in fleet.items() if n > 0}
    fastest = max(c.capacity.peak_frames_per_s for c in present.values())
    return [PoolSpec(gpu_class=name, min_replicas=min(2, fleet[name]), max_replicas=fleet[name],
                     weight=round(fleet[name] * cls.capacity.peak_frames_per_s / fastest, 4))
            for name, cls in sorted(present.items())]


def training_class(fleet: dict[str, int], catalog: GpuCatalog) -> str:
    """Where training runs: the fleet's class with the most GPU memory (ties by name)."""
    return max((n for n, k in fleet.items() if k > 0), key=lambda n: (catalog.get(n).memory_gb, n))


def default_training(fleet: dict[str, int], days: float, seed: int, catalog: GpuCatalog,
                     gpus_per_node: int = 8) -> list[TrainingJob]:
    """A light, deterministic stream of whole-node training jobs (a few per day).

    On the class with the most memory, only when it has at least 4 nodes, each job at most a
    quarter of them, so inference always keeps room.
    """
    import numpy as np

    cls = training_class(fleet, catalog)
    nodes = fleet[cls] // gpus_per_node
    if nodes < 4:
        return []
    rng = np.random.default_rng(seed + 101)
    jobs = []
    t = float(rng.uniform(2, 6) * 3600)
    while t < days * 86400:
        want = int(rng.choice([1, 1, 2]))
        jobs.append(TrainingJob(gpu_class=cls, nodes=min(want, max(1, math.floor(nodes / 4))),
                                submit_s=t, duration_s=float(rng.uniform(1.0, 4.0) * 3600)))
        t += float(rng.uniform(6, 14) * 3600)
    return jobs

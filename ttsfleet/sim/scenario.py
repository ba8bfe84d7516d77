"""Simulation scenarios: the fleet, the deployment, training work, fill work and timing.

The embedded default is a mixed fleet of 32 H200 + 32 RTX 5090 serving one TTS deployment
under a deterministic diurnal trace, sized so that the inference-only baseline sits near the
~50% GPU utilization the source write-up starts from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, FillPolicyConfig, PoolSpec
from ttsfleet.errors import UserError

#: The embedded default fleet of `ttsfleet simulate`.
DEFAULT_FLEET = {"h200": 32, "rtx5090": 32}


class TrainingJob(BaseModel):
    """A training job: arrives at ``submit_s``, needs ``gpus`` of a class for ``duration_s``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu_class: str
    gpus: int = Field(ge=1)
    submit_s: float = Field(ge=0)
    duration_s: float = Field(gt=0)


class FillWorkload(BaseModel):
    """How fill jobs behave in the simulated fleet."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    start_s: float = Field(default=20.0, ge=0, description="pod start until the job does work")
    # Measured: `ttsfleet fill run` (default stages) answers SIGTERM with a committed checkpoint
    # and exit 99 in 0.67-0.78 s on a loaded 2-core machine (5 runs, 2026-11-30); 1 s rounds up.
    stop_s: float = Field(default=1.0, ge=0,
                          description="SIGTERM until the checkpoint is written and the GPU freed")
    item_s: float = Field(default=6.0, gt=0,
                          description="seconds per item; an eviction abandons the current item")
    load_factor: float = Field(default=0.9, gt=0, le=1,
                               description="share of the GPU a running fill job keeps busy "
                                           "(for the load-weighted figure)")


class Scenario(BaseModel):
    """Everything one simulation run needs besides the trace."""

    model_config = ConfigDict(extra="forbid")

    fleet: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_FLEET))
    pools: list[PoolSpec] = Field(default_factory=lambda: default_pools_for(DEFAULT_FLEET))
    autoscale: AutoscaleConfig = AutoscaleConfig()
    fill_policy: FillPolicyConfig = FillPolicyConfig()
    fill: FillWorkload = FillWorkload()
    training: list[TrainingJob] = Field(default_factory=list)
    policy_interval_s: float = Field(default=15.0, gt=0,
                                     description="operator cadence: autoscaler and fill timers")
    queue_per_replica: int = Field(default=64, ge=0,
                                   description="bounded server queue per replica; beyond it 429")
    training_load_factor: float = Field(default=0.95, gt=0, le=1)
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
    def _pools_fit(self) -> Scenario:
        for p in self.pools:
            if p.gpu_class not in self.fleet:
                raise ValueError(f"pool {p.key} uses GPU class {p.gpu_class!r} absent from the fleet")
        for j in self.training:
            if j.gpu_class not in self.fleet:
                raise ValueError(f"training job uses GPU class {j.gpu_class!r} absent from the fleet")
        return self

    def check_catalog(self, catalog: GpuCatalog) -> None:
        """Fail with a readable error if a class is unknown to the catalog."""
        for name in self.fleet:
            try:
                catalog.get(name)
            except ValueError as exc:
                raise UserError(str(exc)) from None


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


def default_pools_for(fleet: dict[str, int]) -> list[PoolSpec]:
    """One pool per GPU class, weighted by the class's share of the fleet's throughput."""
    catalog = GpuCatalog.default()
    pools = []
    for name, n in sorted(fleet.items()):
        if n == 0:
            continue
        cls = catalog.get(name)
        pools.append(PoolSpec(gpu_class=name, min_replicas=min(2, n), max_replicas=n,
                              weight=round(n * cls.capacity.peak_frames_per_s / 8006.0, 4)))
    return pools


def default_training(fleet: dict[str, int], days: float, seed: int) -> list[TrainingJob]:
    """A light, deterministic stream of training jobs on the H200s (a few per day)."""
    import numpy as np

    n = fleet.get("h200", 0)
    if n < 8:
        return []
    rng = np.random.default_rng(seed + 101)
    jobs = []
    t = float(rng.uniform(2, 6) * 3600)
    while t < days * 86400:
        gpus = int(rng.choice([2, 4, 8]))
        jobs.append(TrainingJob(gpu_class="h200", gpus=min(gpus, n // 4), submit_s=t,
                                duration_s=float(rng.uniform(1.0, 4.0) * 3600)))
        t += float(rng.uniform(6, 14) * 3600)
    return jobs

"""Fill admission and eviction for one GPU class: inference > training > cleaning.

Pure and deterministic. ``plan_fill(config, observation)`` says how many fill jobs to start on
idle GPUs and which running fill jobs to evict, with reasons. The Kubernetes fill controller,
the Slurm fill agent and the simulator each build an :class:`ClassObservation` from their own
world and carry out the :class:`FillPlan`; none of them decides anything itself.

Rules:

* Higher-priority work waiting for GPUs (pending inference or training) must find them free: fill
  is evicted for it at once.
* Headroom: GPUs kept empty for inference growth that the demand forecast
  (:mod:`ttsfleet.policy.demand`) expects within the eviction deadline (grace period plus pod
  start), plus a configured minimum, so scale-up never waits for a fill job's grace period.
* Fill jobs already terminating count as freeing capacity, so the same need is never evicted
  twice across consecutive decisions.
* Victims: least un-checkpointed work first (seconds since their last checkpoint), ties broken by
  job id. Exactly enough GPUs are freed: never more than needed.
* Admission: only onto GPUs that are free now and not reserved for demand or headroom, never
  while training waits (when ``hold_while_training_pending``), never beyond ``max_fill_gpus`` or the
  work available.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from ttsfleet.config import FillPolicyConfig


class FillJobView(NamedTuple):
    """A running fill job (pod or Slurm job) as the policy sees it.

    A NamedTuple rather than a dataclass: immutable like the rest of the observation, and cheap
    enough that the simulator can build hundreds per decision at the operator's cadence.
    """

    id: str
    gpus: int = 1
    seconds_since_checkpoint: float = 0.0
    terminating: bool = False


@dataclass(frozen=True)
class ClassObservation:
    """The state of one GPU class at time ``t``."""

    gpu_class: str
    t: float
    total_gpus: int
    inference_gpus: int = 0
    training_gpus: int = 0
    pending_inference_gpus: int = 0
    pending_training_gpus: int = 0
    unavailable_gpus: int = 0
    fill_jobs: tuple[FillJobView, ...] = ()
    fill_gpus_per_job: int = 1
    fill_work_available: int | None = None  # jobs that could still start; None = unbounded
    #: Fill jobs already waiting in the scheduler's queue (e.g. requeued after preemption): they
    #: start on their own as GPUs free up, so admission counts them as already admitted.
    queued_fill_jobs: int = 0
    inference_forecast_gpus: float | None = None  # inference GPUs expected at t + deadline

    def __post_init__(self) -> None:
        for name in ("total_gpus", "inference_gpus", "training_gpus", "pending_inference_gpus",
                     "pending_training_gpus", "unavailable_gpus", "queued_fill_jobs"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.fill_gpus_per_job < 1:
            raise ValueError("fill_gpus_per_job must be >= 1")
        ids = [j.id for j in self.fill_jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("fill job ids must be unique")


@dataclass(frozen=True)
class FillPlan:
    gpu_class: str
    admit: int  # fill jobs to start
    evict: tuple[str, ...]  # fill job ids to stop (gracefully)
    free_gpus: int
    reserved_gpus: int  # demand now + headroom
    headroom_gpus: int
    reasons: tuple[str, ...]


def fill_gpus(jobs: Sequence[FillJobView], *, terminating: bool) -> int:
    return sum(j.gpus for j in jobs if j.terminating == terminating)


def headroom_gpus(config: FillPolicyConfig, obs: ClassObservation) -> int:
    """GPUs to keep empty for inference growth expected within the eviction deadline."""
    base = config.min_free_gpus + math.ceil(config.headroom_fraction * obs.inference_gpus - 1e-9)
    growth = 0
    if obs.inference_forecast_gpus is not None:
        placed_or_pending = obs.inference_gpus + obs.pending_inference_gpus
        growth = max(0, math.ceil(obs.inference_forecast_gpus - placed_or_pending - 1e-9))
    return base + growth


def choose_victims(jobs: Sequence[FillJobView], gpus_needed: int) -> tuple[str, ...]:
    """Running fill jobs to evict: least un-checkpointed work first, just enough GPUs."""
    if gpus_needed <= 0:
        return ()
    candidates = sorted((j for j in jobs if not j.terminating),
                        key=lambda j: (j.seconds_since_checkpoint, j.id))
    victims: list[str] = []
    freed = 0
    for j in candidates:
        if freed >= gpus_needed:
            break
        victims.append(j.id)
        freed += j.gpus
    return tuple(victims)


def plan_fill(config: FillPolicyConfig, obs: ClassObservation) -> FillPlan:
    """Decide fill admissions and evictions for one GPU class."""
    running = fill_gpus(obs.fill_jobs, terminating=False)
    terminating = fill_gpus(obs.fill_jobs, terminating=True)
    usable = max(obs.total_gpus - obs.unavailable_gpus, 0)
    held = obs.inference_gpus + obs.training_gpus + running + terminating
    free = max(usable - held, 0)
    # Where the scheduler itself preempts fill for pending training (Slurm's partition_prio), the
    # policy must not evict for it too, or both evict and one job too many is lost.
    evict_for_training = 0 if config.scheduler_preempts_training else obs.pending_training_gpus
    demand = obs.pending_inference_gpus + obs.pending_training_gpus
    evict_demand = obs.pending_inference_gpus + evict_for_training
    headroom = headroom_gpus(config, obs)
    # Headroom can never exceed what fill could give back.
    reserved = demand + min(headroom, max(usable - obs.inference_gpus - obs.training_gpus
                                          - demand, 0))
    reasons: list[str] = []
    becoming_free = free + terminating
    shortfall = reserved - (demand - evict_demand) - becoming_free
    if shortfall > 0:
        victims = choose_victims(obs.fill_jobs, shortfall)
        if victims:
            why = []
            if demand:
                why.append(f"{demand} GPU(s) wanted by pending "
                           + ("inference" if obs.pending_inference_gpus else "")
                           + (" and " if obs.pending_inference_gpus and obs.pending_training_gpus
                              else "")
                           + ("training" if obs.pending_training_gpus else ""))
            if headroom:
                why.append(f"headroom {headroom} GPU(s) for forecast inference growth")
            reasons.append(f"evict {len(victims)} fill job(s): need {reserved} free, "
                           f"{becoming_free} free or freeing; " + "; ".join(why))
        return FillPlan(obs.gpu_class, 0, victims, free, reserved, headroom, tuple(reasons))

    admit_gpus = max(free - reserved, 0)
    if obs.pending_training_gpus and config.hold_while_training_pending:
        admit_gpus = 0
        reasons.append("training pending: holding fill back")
    if config.max_fill_gpus is not None:
        admit_gpus = min(admit_gpus, max(config.max_fill_gpus - running - terminating, 0))
    admit = admit_gpus // obs.fill_gpus_per_job
    if obs.queued_fill_jobs:
        admit = max(admit - obs.queued_fill_jobs, 0)
    if obs.fill_work_available is not None:
        admit = min(admit, obs.fill_work_available)
    if admit:
        reasons.append(f"admit {admit} fill job(s): {free} GPU(s) idle, {reserved} reserved")
    return FillPlan(obs.gpu_class, admit, (), free, reserved, headroom, tuple(reasons))

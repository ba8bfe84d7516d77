"""Fill admission and eviction: inference > training > cleaning, property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttsfleet.config import FillPolicyConfig
from ttsfleet.policy import ClassObservation, FillJobView, forecast_demand, plan_fill

CFG = FillPolicyConfig()


def jobs(*ages, terminating=()):
    return tuple(FillJobView(f"j{i}", 1, a, i in terminating) for i, a in enumerate(ages))


def test_idle_gpus_are_filled():
    plan = plan_fill(CFG, ClassObservation("h200", 0, total_gpus=8, inference_gpus=3))
    assert plan.admit == 5 and plan.evict == ()


def test_pending_inference_evicts_least_unckeckpointed_first():
    obs = ClassObservation("h200", 0, total_gpus=4, inference_gpus=1, pending_inference_gpus=2,
                           fill_jobs=jobs(50.0, 3.0, 20.0))
    plan = plan_fill(CFG, obs)
    assert plan.evict == ("j1", "j2")  # 3 s and 20 s since checkpoint, never the 50 s one
    assert plan.admit == 0
    assert "pending inference" in plan.reasons[0]


def test_terminating_jobs_count_as_freeing():
    obs = ClassObservation("h200", 0, total_gpus=4, inference_gpus=1, pending_inference_gpus=2,
                           fill_jobs=jobs(1.0, 2.0, 3.0, terminating=(0, 1)))
    assert plan_fill(CFG, obs).evict == ()


def test_pending_training_holds_fill_back_and_evicts():
    obs = ClassObservation("h200", 0, total_gpus=8, training_gpus=2, pending_training_gpus=4,
                           fill_jobs=jobs(5, 6, 7, 8))
    plan = plan_fill(CFG, obs)
    assert len(plan.evict) == 2  # 2 free + 2 evicted = 4 for training
    obs2 = ClassObservation("h200", 0, total_gpus=10, pending_training_gpus=1)
    p2 = plan_fill(CFG, obs2)
    assert p2.admit == 0 and "training pending" in p2.reasons[0]


def test_forecast_headroom_is_kept_and_evicted_ahead_of_need():
    obs = ClassObservation("h200", 0, total_gpus=10, inference_gpus=4, fill_jobs=jobs(*[1.0] * 6),
                           inference_forecast_gpus=6.2)
    plan = plan_fill(CFG, obs)
    assert plan.headroom_gpus == 3
    assert len(plan.evict) == 3


def test_max_fill_gpus_and_work_available():
    cfg = FillPolicyConfig(max_fill_gpus=3)
    assert plan_fill(cfg, ClassObservation("h200", 0, total_gpus=10)).admit == 3
    obs = ClassObservation("h200", 0, total_gpus=10, fill_work_available=2)
    assert plan_fill(CFG, obs).admit == 2


def test_min_free_and_fraction_headroom():
    cfg = FillPolicyConfig(min_free_gpus=1, headroom_fraction=0.25)
    plan = plan_fill(cfg, ClassObservation("h200", 0, total_gpus=10, inference_gpus=4))
    assert plan.headroom_gpus == 2 and plan.admit == 4


def test_observation_validation():
    with pytest.raises(ValueError, match="total_gpus"):
        ClassObservation("h200", 0, total_gpus=-1)
    with pytest.raises(ValueError, match="unique"):
        ClassObservation("h200", 0, total_gpus=2, fill_jobs=(FillJobView("a"), FillJobView("a")))


def test_forecast_extrapolates_growth_only():
    rising = [(float(t), 10 + t / 60) for t in range(0, 301, 15)]
    assert forecast_demand(rising, 300, 120, 300) == pytest.approx(15 + 2, rel=1e-6)
    falling = [(float(t), 20 - t / 60) for t in range(0, 301, 15)]
    assert forecast_demand(falling, 300, 120, 300) == pytest.approx(15)
    assert forecast_demand([], 0, 120, 300) is None


observations = st.builds(
    lambda total, inf, train, pinf, ptrain, unav, ages, term, fc: ClassObservation(
        "h200", 0.0, total_gpus=total, inference_gpus=min(inf, total),
        training_gpus=min(train, max(total - min(inf, total), 0)), pending_inference_gpus=pinf,
        pending_training_gpus=ptrain, unavailable_gpus=unav,
        fill_jobs=tuple(FillJobView(f"j{i:03d}", 1, a, i in term) for i, a in enumerate(
            ages[:max(total - min(inf, total) - min(train, max(total - min(inf, total), 0)), 0)])),
        inference_forecast_gpus=fc),
    st.integers(0, 64), st.integers(0, 64), st.integers(0, 16), st.integers(0, 16),
    st.integers(0, 8), st.integers(0, 4), st.lists(st.floats(0, 600), max_size=64),
    st.sets(st.integers(0, 63), max_size=10), st.one_of(st.none(), st.floats(0, 80)))


@settings(max_examples=300, deadline=None)
@given(observations, st.integers(0, 4), st.floats(0, 0.5))
def test_fill_invariants(obs, min_free, frac):
    cfg = FillPolicyConfig(min_free_gpus=min_free, headroom_fraction=frac)
    plan = plan_fill(cfg, obs)
    assert plan == plan_fill(cfg, obs)  # deterministic
    # input order does not matter
    rev = ClassObservation(**{**obs.__dict__, "fill_jobs": tuple(reversed(obs.fill_jobs))})
    assert plan == plan_fill(cfg, rev)
    running = [j for j in obs.fill_jobs if not j.terminating]
    held = obs.inference_gpus + obs.training_gpus + len(obs.fill_jobs)
    usable = max(obs.total_gpus - obs.unavailable_gpus, 0)
    # never more pods than GPUs
    assert held - len(plan.evict) + plan.admit <= max(usable, held - len(plan.evict))
    if held <= usable:
        assert held + plan.admit <= usable
    # never admit and evict at once; evict only running jobs, never more than needed
    assert not (plan.admit and plan.evict)
    assert set(plan.evict) <= {j.id for j in running}
    if plan.evict:
        free_or_freeing = max(usable - held, 0) + sum(j.terminating for j in obs.fill_jobs)
        shortfall = plan.reserved_gpus - free_or_freeing
        assert len(plan.evict) <= shortfall
        assert len(plan.evict) == min(shortfall, len(running))
        # victims are those with the least un-checkpointed work
        chosen = [j for j in running if j.id in plan.evict]
        spared = [j for j in running if j.id not in plan.evict]
        if spared:
            assert max(j.seconds_since_checkpoint for j in chosen) <= min(
                j.seconds_since_checkpoint for j in spared)
    # nothing admitted while higher-priority work waits
    if obs.pending_inference_gpus or obs.pending_training_gpus:
        free_after = max(usable - held, 0) - plan.reserved_gpus
        assert plan.admit <= max(free_after, 0)


def test_queued_fill_jobs_count_as_admitted():
    obs = ClassObservation("h200", 0, total_gpus=8, inference_gpus=2, queued_fill_jobs=4)
    assert plan_fill(CFG, obs).admit == 2


def test_scheduler_that_preempts_for_training_is_not_doubled():
    obs = ClassObservation("h200", 0, total_gpus=4, pending_training_gpus=2,
                           fill_jobs=jobs(1.0, 2.0, 3.0, 4.0))
    assert len(plan_fill(CFG, obs).evict) == 2
    slurm_like = FillPolicyConfig(scheduler_preempts_training=True)
    plan = plan_fill(slurm_like, obs)
    assert plan.evict == () and plan.admit == 0
    # pending inference is still evicted for: no scheduler does that for us
    obs2 = ClassObservation("h200", 0, total_gpus=4, pending_inference_gpus=1, pending_training_gpus=2,
                            fill_jobs=jobs(1.0, 2.0, 3.0, 4.0))
    assert plan_fill(slurm_like, obs2).evict == ("j0",)

"""Fill admission and eviction: inference > training > cleaning, property-tested."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttsfleet.config import FillPolicyConfig
from ttsfleet.policy import ClassObservation, FillJobView, NodeView, forecast_demand, plan_fill

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


# -- nodes: training takes whole nodes, so fill and inference must not scatter ----------------

def on(node, *ages, start=0, terminating=()):
    return tuple(FillJobView(f"{node}-j{start + i}", 1, a, i in terminating, node)
                 for i, a in enumerate(ages))


def test_without_nodes_the_plan_is_node_blind():
    obs = ClassObservation("h200", 0, total_gpus=8, inference_gpus=3)
    plan = plan_fill(CFG, obs)
    assert plan.placements == () and plan.inference_nodes == ()


def test_inference_victims_come_from_nodes_that_already_hold_inference():
    # n1 holds 4 inference GPUs and 4 fill; n2 holds only fill, with less un-checkpointed work
    nodes = (NodeView("n1", 8, inference_gpus=4), NodeView("n2", 8))
    fill = on("n1", 50.0, 40.0, 30.0, 20.0) + on("n2", *[1.0] * 8)
    obs = ClassObservation("h200", 0, total_gpus=16, inference_gpus=4, pending_inference_gpus=2,
                           fill_jobs=fill, nodes=nodes)
    plan = plan_fill(CFG, obs)
    # n2 stays whole for training; within n1 the least un-checkpointed work goes first
    assert plan.evict == ("n1-j3", "n1-j2")
    assert plan.inference_nodes[0] == "n1"
    # node-blind, the same need would have broken into n2
    blind = ClassObservation(**{**obs.__dict__, "nodes": ()})
    assert all(v.startswith("n2") for v in plan_fill(CFG, blind).evict)


def test_inference_victims_spill_onto_one_node_not_many():
    nodes = (NodeView("a", 8), NodeView("b", 8), NodeView("c", 8))
    fill = on("a", *[5.0] * 8) + on("b", *[4.0] * 8) + on("c", *[3.0] * 8)
    obs = ClassObservation("h200", 0, total_gpus=24, pending_inference_gpus=3, fill_jobs=fill,
                           nodes=nodes)
    victims = plan_fill(CFG, obs).evict
    assert len(victims) == 3 and len({v.split("-")[0] for v in victims}) == 1


def test_training_victims_free_a_whole_node_with_the_fewest_evictions():
    # the policy evicts for training itself (no scheduler preemption): node c has the least fill
    nodes = (NodeView("a", 8, inference_gpus=6), NodeView("b", 8), NodeView("c", 8))
    fill = on("a", 1.0, 1.0) + on("b", *[2.0] * 8) + on("c", *[9.0] * 6)
    obs = ClassObservation("h200", 0, total_gpus=24, inference_gpus=6, pending_training_gpus=8,
                           fill_jobs=fill, nodes=nodes)
    plan = plan_fill(CFG, obs)
    # 2 GPUs of c are free already: exactly 6 more, all on c, although a's and b's jobs are younger
    assert sorted(plan.evict) == sorted(j.id for j in fill if j.node == "c")
    # with a GPU of head-room on top, the whole node still frees first, then one more GPU
    plan = plan_fill(FillPolicyConfig(min_free_gpus=1), obs)
    assert len(plan.evict) == 7 and {j.id for j in fill if j.node == "c"} <= set(plan.evict)


def test_fill_is_placed_where_fill_packs_and_away_from_inference():
    nodes = (NodeView("a", 8, inference_gpus=5), NodeView("b", 8), NodeView("c", 8))
    fill = on("b", *[1.0] * 6)
    obs = ClassObservation("h200", 0, total_gpus=24, inference_gpus=5, fill_jobs=fill, nodes=nodes)
    plan = plan_fill(CFG, obs)
    assert plan.admit == 13
    # b's 2 free GPUs first (it already holds fill), then the empty c, inference's node last
    assert plan.placements == ("b",) * 2 + ("c",) * 8 + ("a",) * 3
    assert plan.inference_nodes == ("a", "b", "c")


def test_node_names_must_be_unique():
    with pytest.raises(ValueError, match="node names"):
        ClassObservation("h200", 0, total_gpus=16, nodes=(NodeView("a", 8), NodeView("a", 8)))


@st.composite
def node_observations(draw):
    """A class of whole nodes, each holding some inference or training and some fill."""
    n_nodes = draw(st.integers(1, 6))
    nodes, fill = [], []
    inference = training = 0
    for i in range(n_nodes):
        size = draw(st.sampled_from([8, 8, 4]))
        inf = draw(st.integers(0, size))
        train = size if inf == 0 and draw(st.booleans()) and draw(st.booleans()) else 0
        k = draw(st.integers(0, size - inf - train))
        ages = draw(st.lists(st.floats(0, 600), min_size=k, max_size=k))
        term = draw(st.sets(st.integers(0, max(k - 1, 0)), max_size=2))
        nodes.append(NodeView(f"n{i}", size, inf, train))
        fill += [FillJobView(f"n{i}-j{j}", 1, a, j in term, f"n{i}") for j, a in enumerate(ages)]
        inference, training = inference + inf, training + train
    total = sum(n.gpus for n in nodes)
    return ClassObservation(
        "h200", 0.0, total_gpus=total, inference_gpus=inference, training_gpus=training,
        pending_inference_gpus=draw(st.integers(0, 6)),
        pending_training_gpus=draw(st.sampled_from([0, 0, 8])), fill_jobs=tuple(fill),
        inference_forecast_gpus=draw(st.one_of(st.none(), st.floats(0, 40))), nodes=tuple(nodes))


@settings(max_examples=300, deadline=None)
@given(node_observations(), st.integers(0, 2))
def test_node_rules_invariants(obs, min_free):
    cfg = FillPolicyConfig(min_free_gpus=min_free)
    plan = plan_fill(cfg, obs)
    shuffled = ClassObservation(**{**obs.__dict__, "fill_jobs": tuple(reversed(obs.fill_jobs)),
                                   "nodes": tuple(reversed(obs.nodes))})
    assert plan == plan_fill(cfg, shuffled)  # deterministic, independent of input order
    # the nodes change where, never how many: the same counts as the node-blind plan
    blind = plan_fill(cfg, ClassObservation(**{**obs.__dict__, "nodes": ()}))
    assert (plan.admit, len(plan.evict), plan.reserved_gpus) == (blind.admit, len(blind.evict),
                                                                 blind.reserved_gpus)
    running = [j for j in obs.fill_jobs if not j.terminating]
    assert set(plan.evict) <= {j.id for j in running}
    by_node = {n.name: n for n in obs.nodes}
    chosen = [j for j in running if j.id in plan.evict]
    spared = [j for j in running if j.id not in plan.evict]
    for v in chosen:  # within a node, the least un-checkpointed work goes first
        assert all(v.seconds_since_checkpoint <= s.seconds_since_checkpoint
                   for s in spared if s.node == v.node)
    busy = {n.name: n.inference_gpus + n.training_gpus for n in obs.nodes}
    training_only = obs.pending_training_gpus and not obs.pending_inference_gpus
    fill_running = {}
    for j in running:
        fill_running[j.node] = fill_running.get(j.node, 0) + 1
    for v in chosen:
        for s in spared:
            if s.node == v.node:
                continue
            if training_only:  # a whole node with the fewest evictions: no inference, least fill
                assert (busy[v.node] > 0, fill_running[v.node]) <= (busy[s.node] > 0,
                                                                    fill_running[s.node])
            else:  # for inference: never spare a node that holds more non-fill work
                assert busy[v.node] >= busy[s.node]
    # placements: one per admitted job at most, never more on a node than it has free
    assert len(plan.placements) <= plan.admit
    fill_on = {}
    for j in obs.fill_jobs:
        fill_on[j.node] = fill_on.get(j.node, 0) + 1
    for name in set(plan.placements):
        n = by_node[name]
        free = n.gpus - n.inference_gpus - n.training_gpus - fill_on.get(name, 0)
        assert plan.placements.count(name) <= free
    assert sorted(plan.inference_nodes) == sorted(by_node)

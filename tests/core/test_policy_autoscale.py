"""Autoscaling policy: every rule, plus property tests of its invariants."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, PoolSpec
from ttsfleet.policy import (
    AutoscaleState,
    DeploymentSignals,
    PoolSignals,
    decide_replicas,
    pool_targets,
    split_load,
)

CAT = GpuCatalog.default()
CFG = AutoscaleConfig(target_in_flight_per_replica=40, stable_window_s=60, panic_window_s=15,
                      scale_down_stabilization_s=300)
H200 = PoolSpec(gpu_class="h200", min_replicas=1, max_replicas=20)
POOLS = [H200]


def step(state, t, in_flight, ready, current, queue=0.0, ttfa=None, pools=POOLS, cfg=CFG):
    sig = DeploymentSignals(t, {pools[0].key: PoolSignals(in_flight=in_flight, queue_depth=queue,
                                                          ready_replicas=ready, current_replicas=current,
                                                          ttfa_p99_s=ttfa)})
    return decide_replicas(cfg, pools, CAT, state, sig)


def test_load_target_sets_replicas():
    d, _ = step(AutoscaleState(), 0, in_flight=200, ready=5, current=5)
    (p,) = d.pools
    assert p.desired == 5 and p.reason == "steady"
    d, _ = step(AutoscaleState(), 0, in_flight=300, ready=5, current=5)
    assert d.pools[0].desired == math.ceil(300 / 40)
    assert d.pools[0].direction == "up"


def test_stable_window_averages_load():
    s = AutoscaleState()
    d, s = step(s, 0, 80, 2, 2)
    d, s = step(s, 15, 80, 2, 2)
    d, s = step(s, 30, 80, 2, 2)
    d, s = step(s, 45, 110, 2, 2)  # below the panic threshold (1.5 x 80)
    assert d.stable_load == pytest.approx((80 * 3 + 110) / 4)
    assert d.panic_load == pytest.approx(110)  # the panic window holds only the newest sample
    assert d.pools[0].desired == 3
    assert not d.panic
    # samples older than the stable window are forgotten
    d, s = step(s, 120, 110, 3, 3)
    assert d.stable_load == pytest.approx(110)


def test_panic_uses_short_window_and_blocks_scale_down():
    s = AutoscaleState()
    for t in (0, 15, 30):
        _, s = step(s, t, 40, 1, 1)
    d, s = step(s, 45, 400, 1, 1)  # 10x capacity: panic
    assert d.panic and d.pools[0].reason == "panic"
    assert d.pools[0].desired >= 4  # at least max_scale_up_rate x ready
    # while panicking, a quiet sample never scales down
    d2, s = step(s, 60, 0, d.pools[0].desired, d.pools[0].desired)
    assert d2.panic and d2.pools[0].desired == d.pools[0].desired


def test_scale_up_rate_limit():
    d, _ = step(AutoscaleState(), 0, in_flight=4000, ready=2, current=2)
    assert d.pools[0].desired == max(math.ceil(2 * CFG.max_scale_up_rate), 2 + 4)
    assert "capped" in d.pools[0].message
    # what the load needs beyond this step is reported, for fill eviction ahead of need
    assert d.pools[0].needed == H200.max_replicas


def test_scale_down_is_stabilized_then_halves_at_most():
    s = AutoscaleState()
    d, s = step(s, 0, 400, 10, 10)
    assert d.pools[0].desired == 10
    d, s = step(s, 15, 40, 10, 10)  # load collapsed, but 400 still in the stable window
    assert d.pools[0].desired == 10
    t = 15
    while t < 400:
        t += 15
        d, s = step(s, t, 40, 10, 10)
    # after the stabilization window, at most half removed in one step
    assert d.pools[0].desired == 5
    assert d.pools[0].reason == "stabilized"


def test_slo_breach_adds_replicas_even_at_target_load():
    d, _ = step(AutoscaleState(), 0, in_flight=200, ready=5, current=5, ttfa=0.9)
    assert d.pools[0].desired == 6 and d.pools[0].reason == "slo"


def test_queue_pressure_adds_replicas():
    d, _ = step(AutoscaleState(), 0, in_flight=200, ready=5, current=5, queue=5 * 4 + 1)
    assert d.pools[0].desired > 5


def test_min_max_clamp_with_reason():
    d, _ = step(AutoscaleState(), 0, in_flight=0, ready=1, current=1)
    assert d.pools[0].desired == 1
    small = [PoolSpec(gpu_class="h200", min_replicas=0, max_replicas=3)]
    d, _ = step(AutoscaleState(), 0, in_flight=1000, ready=3, current=3, pools=small)
    assert d.pools[0].desired == 3


def test_targets_scale_with_class_throughput():
    pools = [PoolSpec(gpu_class="h200"), PoolSpec(gpu_class="rtx5090")]
    t = pool_targets(pools, CAT, CFG)
    assert t["h200"] == 40
    assert t["rtx5090"] == pytest.approx(40 * 5869 / 8006, rel=1e-3)


def test_split_load_water_fills_around_max():
    pools = [PoolSpec(gpu_class="h200", min_replicas=0, max_replicas=2, weight=3),
             PoolSpec(gpu_class="rtx5090", min_replicas=0, max_replicas=50, weight=1)]
    targets = {"h200": 40.0, "rtx5090": 20.0}
    r = split_load(400, pools, targets)
    assert r["h200"] == 2
    # the rest (400 - 80) goes to the other pool
    assert r["rtx5090"] == math.ceil(320 / 20)


def test_rejects_duplicate_pool_names():
    with pytest.raises(ValueError, match="unique"):
        decide_replicas(CFG, [H200, H200], CAT, AutoscaleState(), DeploymentSignals(0, {}))


def test_pool_spec_validation():
    with pytest.raises(ValueError, match="minReplicas"):
        PoolSpec(gpu_class="h200", min_replicas=5, max_replicas=2)
    with pytest.raises(ValueError):
        PoolSpec(gpu_class="h200", min_replicas=-1)
    # camelCase on the wire
    p = PoolSpec.model_validate({"gpuClass": "rtx5090", "minReplicas": 2, "maxReplicas": 4})
    assert p.min_replicas == 2 and p.model_dump(by_alias=True)["gpuClass"] == "rtx5090"


signals = st.builds(
    PoolSignals,
    in_flight=st.floats(0, 5000), queue_depth=st.floats(0, 2000), ready_replicas=st.integers(0, 40),
    current_replicas=st.integers(0, 40),
    ttfa_p99_s=st.one_of(st.none(), st.floats(0.01, 10)))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(signals, signals), min_size=1, max_size=8),
       st.integers(0, 5), st.integers(0, 30))
def test_invariants_bounds_and_determinism(history, lo, span):
    pools = [PoolSpec(gpu_class="h200", min_replicas=lo, max_replicas=lo + span),
             PoolSpec(gpu_class="rtx5090", min_replicas=0, max_replicas=span + 1)]
    s1 = s2 = AutoscaleState()
    for i, (a, b) in enumerate(history):
        sig = DeploymentSignals(15.0 * i, {"h200": a, "rtx5090": b})
        d1, s1 = decide_replicas(CFG, pools, CAT, s1, sig)
        d2, s2 = decide_replicas(CFG, pools, CAT, s2, sig)
        assert d1 == d2  # deterministic: same inputs, same decision
        for p, spec in zip(d1.pools, pools, strict=True):
            assert spec.min_replicas <= p.desired <= spec.max_replicas
            assert p.reason and p.message
            assert p.direction == ("up" if p.desired > p.current else "down" if p.desired < p.current
                                   else "none")


def test_scale_down_victims_are_the_least_busy():
    from ttsfleet.policy import scale_down_victims

    load = {"a": 5.0, "b": 0.0, "c": 2.0, "d": 0.0}
    assert scale_down_victims(load, 2) == ("b", "d")
    assert scale_down_victims(load, 3) == ("b", "d", "c")
    assert scale_down_victims(load, 0) == () and scale_down_victims({}, 2) == ()

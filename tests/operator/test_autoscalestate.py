"""The autoscaler's state through status and back: a restart continues the same window.

Runs the real policy (``decide_replicas``) step by step over a load that rises and falls, once
with the process's full memory and once restarted from ``status.autoscaler`` (to_status ->
JSON -> from_status) at every step in turn, and compares the replicas it decides.
"""

from __future__ import annotations

import json

import pytest
from ttsfleet.operator.autoscalestate import WallClock, from_status, to_status
from ttsfleet.operator.models import AutoscalerMemory

from ttsfleet.catalog import GpuCatalog
from ttsfleet.config import AutoscaleConfig, PoolSpec
from ttsfleet.policy import AutoscaleState, DeploymentSignals, PoolSignals, decide_replicas

CFG = AutoscaleConfig(target_in_flight_per_replica=10, stable_window_s=5, panic_window_s=5,
                      scale_down_stabilization_s=30)
POOLS = [PoolSpec(gpu_class="h200", min_replicas=1, max_replicas=8)]
CATALOG = GpuCatalog.default()
WALL0 = 1_780_000_000.0  # the wall clock at monotonic 0
STEP = 5.0
#: Load per step: rising, a plateau, then gone.
LOAD = [10, 30, 60, 60, 60, 60, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def step(state: AutoscaleState, replicas: int, t: float, load: float,
         cfg: AutoscaleConfig = CFG) -> tuple[int, AutoscaleState]:
    sig = DeploymentSignals(t=t, pools={"h200": PoolSignals(in_flight=load, ready_replicas=replicas,
                                                            current_replicas=replicas)})
    decision, state = decide_replicas(cfg, POOLS, CATALOG, state, sig)
    return decision.pools[0].desired, state


def run(loads: list[float], restart_at: int | None = None,
        cfg: AutoscaleConfig = CFG) -> tuple[list[int], list[dict]]:
    """Replicas decided per step (and the status written), restarting once before ``restart_at``."""
    state, clock, replicas, out, written = AutoscaleState(), WallClock(), 1, [], []
    mono0 = 0.0
    for k, load in enumerate(loads):
        t, wall = k * STEP, WALL0 + k * STEP
        if k == restart_at:
            stored = json.loads(json.dumps(written[-1]))  # what the API server kept
            AutoscalerMemory.model_validate(stored)  # the CRD's own model
            mono0 = 1000.0  # a new process: another monotonic origin
            state, clock = from_status(stored, t + mono0, wall)
        replicas, state = step(state, replicas, t + mono0, load, cfg)
        out.append(replicas)
        written.append(to_status(state, clock, t + mono0, wall))
    return out, written


def test_full_memory_scales_down_after_the_window() -> None:
    replicas, _ = run(LOAD)
    top = max(replicas)
    assert top >= 6
    last_high = max(k for k, r in enumerate(replicas) if r == top)
    # the top is last recommended at step 5 (the last 60); the 30 s window holds it 5 steps more
    assert last_high == 5 + int(CFG.scale_down_stabilization_s / STEP) - 1
    assert replicas[-1] < top


@pytest.mark.parametrize("restart_at", range(1, len(LOAD)))
def test_a_restart_anywhere_continues_the_same_window(restart_at: int) -> None:
    full, _ = run(LOAD)
    restarted, _ = run(LOAD, restart_at)
    assert all(r >= f for r, f in zip(restarted, full, strict=True)), \
        f"dropped replicas earlier than the full memory: {restarted} vs {full}"
    # once the load is gone, the held top expires exactly when the full memory lets it go
    top_full = max(k for k, r in enumerate(full) if r == max(full))
    top_restarted = max(k for k, r in enumerate(restarted) if r == max(full))
    if restart_at > LOAD.index(0):
        assert top_restarted == top_full, f"a fresh window after the restart: {restarted} vs {full}"


def test_a_steady_state_writes_the_same_status() -> None:
    _, written = run([30] * 12)
    assert all(w == written[-1] for w in written[2:]), written
    _, written = run(LOAD)
    tail = written[-4:]  # load gone, the held top expired: nothing moves any more
    assert all(w == tail[0] for w in tail)
    assert any(w["recommendations"] for w in written), "the held top was never written"


def test_panic_survives_a_restart() -> None:
    state = AutoscaleState()
    _, state = step(state, 1, 0.0, 200.0)
    assert state.panic_until is not None
    stored = to_status(state, WallClock(), 0.0, WALL0)
    assert stored["panicUntil"]
    restored, _ = from_status(json.loads(json.dumps(stored)), 500.0, WALL0 + 1)
    assert restored.panic_until is not None and restored.panic_until >= 500.0 + (state.panic_until - 1)
    expired, _ = from_status(stored, 500.0, WALL0 + 3600)
    assert expired.panic_until is None


#: The burst hold (``burstHoldS``): after a panic the scale-down window is 60 s instead of 30 s.
HOLD = CFG.model_copy(update={"burst_hold_s": 60.0})
#: A burst that panics, then quiet long enough for the hold to decide when replicas drop.
BURST = [10, 200, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]


def test_the_last_panic_survives_a_restart() -> None:
    full, written = run(BURST, cfg=HOLD)
    assert any(w["lastPanic"] for w in written)
    plain, _ = run(BURST)
    assert full != plain, "the hold did not change the decisions: the test would not see it lost"
    for restart_at in range(2, len(BURST)):
        restarted, _ = run(BURST, restart_at, cfg=HOLD)
        assert restarted == full, f"restart before step {restart_at}: {restarted} vs {full}"

"""``TTSFLEET_ENGINE_CHECKS``: the engine's state checked after every prefill call and decode step.

What each test pins down, and how it can fail:
* a served run with the checks on ends as the same run with them off (the checks read, never
  write: a check that moved a row or a length would change the frames);
* each planted fault is named: non-finite logits in a request's slot or the pad slot, a decode
  row pointing at the wrong slot, a frame out of its vocabulary, a prefill that left the wrong
  length (a check that passes everything fails these).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ttsfleet.inference import engine_checks
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.engine_checks import EngineStateError, StepRows, check_prefill, check_step
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.sampling import SamplingParams

from tests.inference_server.test_engine import _run


@pytest.fixture
def checks_on():
    engine_checks.ENGINE_CHECKS_SWITCH.set("on")
    yield
    engine_checks.ENGINE_CHECKS_SWITCH.reset()


def _cache(slots: int = 5, seq: int = 32):
    return load_model("tiny").new_cache(slots, seq)


@pytest.mark.parametrize("side_stream", [False, True], ids=["inline", "deferred"])
def test_a_served_run_with_the_checks_on_equals_the_run_without(parts, checks_on, side_stream) -> None:
    """Deferred: prefill calls landed later (the side stream's schedule; on a CPU the deferral alone),
    each checked once its completion is waited for."""
    cfg = EngineConfig(max_running_requests=4, cuda_graph_max_bs=4, pad_to_buckets=True,
                       prefill_stream=side_stream)
    seeds, limits = [1, 2, 3], [6, 11, 16]  # retires mid-run: padded steps at 3, 2 and 1 rows
    eng, checked, _ = _run(parts, cfg, seeds, limits)
    assert eng._checks
    engine_checks.ENGINE_CHECKS_SWITCH.set("off")
    eng_off, plain, _ = _run(parts, cfg, seeds, limits)
    assert not eng_off._checks
    for (codes_a, _, why_a), (codes_b, _, why_b) in zip(checked, plain, strict=True):
        np.testing.assert_array_equal(codes_a, codes_b)
        assert why_a == why_b


def test_non_finite_logits_after_a_prefill_are_named_by_slot() -> None:
    cache = _cache()
    cache.lengths[[1, 3]] = torch.tensor([7, 9])
    check_prefill(cache, [(1, 7), (3, 9)], "prefill call 1")
    cache.pending_logits[3, 5] = float("nan")
    with pytest.raises(EngineStateError, match=r"prefill call 1: non-finite pending logits in slots 3 "
                       r"\[slot 3: K/V finite over 9 positions\]$"):
        check_prefill(cache, [(1, 7), (3, 9)], "prefill call 1")


def test_a_prefill_that_left_the_wrong_length_is_named() -> None:
    cache = _cache()
    cache.lengths[2] = 4
    with pytest.raises(EngineStateError, match=r"slot 2: length 4, expected 6"):
        check_prefill(cache, [(2, 6)], "prefill call 9")


def _step_state(cache, rows: StepRows):
    slots_buf = torch.tensor(list(rows.slots) + [rows.pad_slot] * (rows.padded - len(rows.slots)))
    frames = torch.zeros(rows.padded, 11, dtype=torch.int64)
    return slots_buf, frames


def test_a_clean_step_passes_and_each_planted_fault_is_named() -> None:
    cache = _cache()
    rows = StepRows(slots=[0, 2, 1], padded=4, pad_slot=4, step=17)
    slots_buf, frames = _step_state(cache, rows)
    check_step(cache, slots_buf, frames, rows, (100, 50))

    cache.pending_logits[4, 0] = float("inf")
    cache.lengths[4] = 6
    cache.v[1, 4, 3:5] = float("nan")  # the pad slot's values at positions 3-4 of layer 1
    pad_nan = (r"decode step 17 \(3 rows padded to 4\): .*slots 4 \(the pad slot\) "
               r"\[slot 4: non-finite K/V from layer 1, positions 3\.\.4 \(2 of 6\)\]")
    with pytest.raises(EngineStateError, match=pad_nan):
        check_step(cache, slots_buf, frames, rows, (100, 50))
    cache.pending_logits[4, 0] = 0.0

    moved = slots_buf.clone()
    moved[3] = 1  # a pad row left naming a request's slot
    with pytest.raises(EngineStateError, match=r"row 3: slot 1, meant 4"):
        check_step(cache, moved, frames, rows, (100, 50))

    bad = frames.clone()
    bad[3, 4] = 50  # a code one past its codebook, in a pad row
    with pytest.raises(EngineStateError, match=r"frames out of range: row 3 \(pad\)"):
        check_step(cache, slots_buf, bad, rows, (100, 50))

    cache.lengths[2] = cache.max_seq_len + 1
    with pytest.raises(EngineStateError, match=r"lengths outside 0\.\.32: slot 2: 33"):
        check_step(cache, slots_buf, frames, rows, (100, 50))


def test_the_engine_stops_at_the_step_after_which_a_slot_s_logits_went_bad(parts, checks_on,
                                                                              monkeypatch) -> None:
    """Planted in the engine itself: a step that leaves a request's logits NaN is the one that raises
    (the next step's sampling would be the first to read them)."""
    model, codec, _ = parts
    eng = Engine(model, codec, EngineConfig(max_running_requests=2, cuda_graph_max_bs=2, pad_to_buckets=True))
    slot = eng.free_slots.popleft()
    eng._join(SimpleNamespace(slot=slot, req=SimpleNamespace(sampling=SamplingParams(seed=3)),
                              handle=SimpleNamespace(rid=1), retired=False))
    eng._launch_step()  # a clean step passes
    real_step = model.decode_step

    def poisoned_step(cache, slots, sampling, window=None):  # noqa: ANN001, ANN202
        frames = real_step(cache, slots, sampling, window)
        cache.pending_logits[slot, 1] = float("nan")
        return frames

    monkeypatch.setattr(model, "decode_step", poisoned_step)
    with pytest.raises(EngineStateError, match=rf"decode step \d+ \(1 rows padded to 1\): "
                                               rf"non-finite pending logits in slots {slot} \["):
        eng._launch_step()


def test_a_step_gone_bad_is_rerun_and_the_first_bad_module_named(parts, checks_on, monkeypatch) -> None:
    """A NaN planted in the last layer's MLP weight: the step's logits go non-finite, and the
    report names the weight and the first module whose output went bad in the plain rerun."""
    model, codec, _ = parts
    eng = Engine(model, codec, EngineConfig(max_running_requests=2, cuda_graph_max_bs=2, pad_to_buckets=True))
    for rid in (1, 2):
        eng._join(SimpleNamespace(slot=eng.free_slots.popleft(), handle=SimpleNamespace(rid=rid),
                                  req=SimpleNamespace(sampling=SamplingParams(seed=rid)), retired=False))
    eng._launch_step()
    last = len(model.layers) - 1
    weight = model.layers[last].feed_forward.w2.weight
    saved = weight.detach().clone()
    try:
        with torch.no_grad():
            weight[0, 0] = float("nan")
        with pytest.raises(EngineStateError) as err:
            eng._launch_step()
    finally:
        with torch.no_grad():
            weight.copy_(saved)
    message = str(err.value)
    assert f"non-finite weights: layers.{last}.feed_forward.w2.weight" in message
    assert "fused rerun: 2 of 2 slots non-finite" in message
    first_bad = f"first non-finite output: layers.{last}.feed_forward"
    assert f"plain rerun: 2 of 2 slots non-finite, {first_bad}" in message

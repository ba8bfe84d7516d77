"""The engine with mixed steps on (``TTSFLEET_MIXED_STEPS=on``): prompts that arrive while others decode
ride in the decode step, and every request's codes and end are those of the engine with them off.

How it can fail: a rider landed before its pieces ran (its first frame sampled from stale logits), a
rider joined into the step that carried it (a frame too many or a row mixed up), a piece counted
twice or lost (the prompt's continuation at the wrong position), a slot held by a rider handed out
again. On a CPU the reference model runs the step's slow half and the pieces one after the other;
``tests/inference_model/test_mixed_step.py`` checks the fused one-pass form against that.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ttsfleet.inference.engine import EngineConfig
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.mixed_step import MIXED_STEPS_SWITCH

from tests.inference_server.test_engine import _run


@pytest.fixture
def mixed_on():
    MIXED_STEPS_SWITCH.set("on")
    yield
    MIXED_STEPS_SWITCH.reset()


@pytest.mark.parametrize("side_stream", [False, True], ids=["inline", "side-calls"])
@pytest.mark.parametrize("chunk", [0, 8], ids=["whole-prompts", "chunks-of-8"])
def test_riders_decode_what_separate_prefill_calls_decode(parts, mixed_on, chunk: int,
                                                          side_stream: bool) -> None:
    """Two slots, five requests: three wait for a slot and are prefilled while the others decode
    (with chunks of 8, over several steps, continuing pieces riding too). With the side stream, the
    calls made while nothing decodes land later (on a CPU, the deferral alone), riders beside them."""
    cfg = EngineConfig(max_running_requests=2, max_queue=8, cuda_graph_max_bs=2, pad_to_buckets=True,
                       prefill_stream=side_stream, prefill_chunk_tokens=chunk)
    seeds, limits = [1, 2, 3, 4, 5], [6, 11, 4, 9, 7]
    eng, mixed, _ = _run(parts, cfg, seeds, limits)
    assert eng._mixed and eng.stats.mixed_steps >= 3
    MIXED_STEPS_SWITCH.set("off")
    eng_off, apart, _ = _run(parts, cfg, seeds, limits)
    assert eng_off.stats.mixed_steps == 0
    assert eng.stats.prefill_tokens == eng_off.stats.prefill_tokens
    assert eng.stats.prefill_calls < eng_off.stats.prefill_calls
    for (codes_a, _, why_a), (codes_b, _, why_b) in zip(mixed, apart, strict=True):
        np.testing.assert_array_equal(codes_a, codes_b)
        assert why_a == why_b
    assert sorted(eng.free_slots) == [0, 1] and not eng._riders


@pytest.mark.gpu
def test_on_a_gpu_mixed_steps_replay_their_first_halves_and_every_request_ends(mixed_on) -> None:
    """On a GPU: the decode graphs' first halves are captured beside the whole steps, riders go through
    the prefill graphs, and every request ends as asked (the numerics against the step then the call
    are ``tests/inference_model/test_mixed_step.py``'s: on a GPU the GEMMs' row counts differ)."""
    from ttsfleet.inference.codec import load_codec
    from ttsfleet.inference.tokenizer import load_tokenizer

    model = load_model("tiny", device="cuda", dtype=torch.bfloat16)
    parts = (model, load_codec("tiny", device="cuda"), load_tokenizer("tiny"))
    cfg = EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4, device="cuda",
                       pad_to_buckets=True, cuda_graphs=True, prefill_graphs=True)
    seeds, limits = [31, 32, 33, 34, 35, 36, 37], [5, 12, 7, 9, 6, 10, 8]
    eng, out, _ = _run(parts, cfg, seeds, limits)
    assert sorted(eng.graphs.fronts) == sorted(eng.graphs.graphs) == [1, 2, 4]
    assert eng.prefill_graphs is not None and eng.stats.mixed_steps >= 3
    for (codes, _, why), limit in zip(out, limits, strict=True):
        assert why in ("stop", "length") and 1 <= codes.shape[1] <= limit
        assert why == "stop" or codes.shape[1] == limit

"""The DualAR model reproduces the public reference's outputs on both released checkpoint layouts."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams


def _close(actual: torch.Tensor, expected: list, tol: dict) -> None:
    torch.testing.assert_close(actual.float(), torch.tensor(expected, dtype=torch.float32),
                               atol=tol["abs"], rtol=tol["rel"])


@pytest.mark.parametrize("name", ["s2-tiny", "s1-tiny"])
def test_prefill_and_fast_logits_match_reference(name: str, golden, golden_dir) -> None:
    g = golden(name)
    model = load_model(golden_dir / name, config_overrides={"im_end_id": g["im_end_id"]})
    prompt = torch.tensor(g["prompt"])
    logits, to_fast = model.forward_slow(prompt[None])
    _close(logits[0, -1], g["prefill_last_logits"], g["tolerance"])
    _close(to_fast[0, -1], g["prefill_last_hidden_to_fast"], g["tolerance"])
    tf = g["fast_logits_teacher_forced"]
    fast = model.fast_logits(to_fast[:, -1], torch.tensor(tf["codes_frame"])[None])
    _close(fast[0], tf["logits"], g["tolerance"])


@pytest.mark.parametrize("name", ["s2-tiny", "s1-tiny"])
def test_cached_prefill_keeps_reference_logits(name: str, golden, golden_dir) -> None:
    g = golden(name)
    model = load_model(golden_dir / name, config_overrides={"im_end_id": g["im_end_id"]})
    c = model.config
    cache = model.new_cache(3, 64)
    model.prefill(cache, 2, torch.tensor(g["prompt"]))
    full = torch.tensor(g["prefill_last_logits"])
    allowed = torch.cat([full[c.semantic_begin_id:c.semantic_end_id + 1], full[c.im_end_id:c.im_end_id + 1]])
    torch.testing.assert_close(cache.pending_logits[2], allowed, atol=g["tolerance"]["abs"],
                               rtol=g["tolerance"]["rel"])
    assert cache.length(2) == len(g["prompt"][0])


def test_greedy_frames_match_reference_exactly(golden, golden_dir) -> None:
    g = golden("s2-tiny")
    model = load_model(golden_dir / "s2-tiny")
    cache = model.new_cache(1, 64)
    model.prefill(cache, 0, torch.tensor(g["prompt"]))
    greedy = SamplingBatch.from_params([SamplingParams(temperature=0.0)])
    frames = [model.decode_step(cache, torch.tensor([0]), greedy)[0].tolist() for _ in g["greedy_frames"]]
    assert frames == g["greedy_frames"]


def test_greedy_frames_exact_inside_a_mixed_batch(golden, golden_dir) -> None:
    """The golden request decodes identically when batched with another request at another position."""
    g = golden("s2-tiny")
    model = load_model(golden_dir / "s2-tiny")
    prompt = torch.tensor(g["prompt"])
    cache = model.new_cache(4, 64)
    model.prefill(cache, 1, prompt[:, :9])  # a different, shorter request
    model.prefill(cache, 3, prompt)
    batch = SamplingBatch.from_params([SamplingParams(temperature=0.0), SamplingParams(top_k=1)])
    window = torch.full((2, 16, 10), -1, dtype=torch.int32)
    slots = torch.tensor([3, 1])
    out = [model.decode_step(cache, slots, batch, window)[0].tolist() for _ in g["greedy_frames"]]
    assert out == g["greedy_frames"]

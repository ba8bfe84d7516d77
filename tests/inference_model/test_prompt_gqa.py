"""Prompt attention's two GQA modes compute the same function: ``native`` (SDPA's ``enable_gqa``)
skips the K/V copies ``expand`` makes, and must not change a single greedy frame."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference import model_layers
from ttsfleet.inference.model import PrefillPiece
from ttsfleet.inference.model_layers import attend, prompt_gqa, set_prompt_gqa
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams


@pytest.fixture
def restore_mode():
    before = prompt_gqa()
    yield
    set_prompt_gqa(before)


def _attend_in(mode: str, *args, **kwargs) -> torch.Tensor:  # noqa: ANN002, ANN003
    set_prompt_gqa(mode)
    return attend(*args, **kwargs)


@pytest.mark.parametrize("masked", [False, True])
def test_native_gqa_equals_expanded_heads(restore_mode, masked: bool) -> None:  # noqa: ANN001
    g = torch.Generator().manual_seed(1)
    q = torch.randn(3, 7, 8, 16, generator=g)
    k, v = (torch.randn(3, 11, 2, 16, generator=g) for _ in range(2))
    mask = torch.rand(3, 1, 7, 11, generator=g) > 0.3 if masked else None
    if mask is not None:
        mask[..., 0] = True  # every query keeps one key
    causal = not masked
    ks, vs = (k, v) if masked else (k[:, :7], v[:, :7])
    expanded = _attend_in("expand", q, ks, vs, mask, causal=causal)
    native = _attend_in("native", q, ks, vs, mask, causal=causal)
    assert native.shape == (3, 7, 8 * 16)
    torch.testing.assert_close(native, expanded, rtol=1e-5, atol=1e-6)
    # and the grouping is the reference one: query head h reads KV head h // 4
    wrong = attend(q, ks.roll(1, dims=2), vs.roll(1, dims=2), mask, causal=causal)
    assert not torch.allclose(wrong, expanded, atol=1e-3)


def _greedy_after_batched_prefill(model, mode: str) -> list[list[int]]:  # noqa: ANN001
    set_prompt_gqa(mode)
    c = model.config
    g = torch.Generator().manual_seed(5)
    cache = model.new_cache(2, 128)
    pieces = []
    for slot, t in ((0, 23), (1, 31)):
        ids = torch.randint(0, c.semantic_begin_id, (t,), generator=g)
        codes = torch.zeros(c.num_codebooks, t, dtype=torch.int64)
        pieces.append(PrefillPiece(slot, torch.cat([ids[None], codes])))
    model.prefill_batch(cache, pieces)
    greedy = SamplingBatch.from_params([SamplingParams(temperature=0.0)] * 2)
    return [model.decode_step(cache, torch.tensor([0, 1]), greedy).tolist() for _ in range(4)]


def test_model_frames_are_the_same_in_both_modes(tiny_model, restore_mode) -> None:  # noqa: ANN001
    assert tiny_model.config.n_local_heads < tiny_model.config.n_head  # the tiny model is GQA
    native = _greedy_after_batched_prefill(tiny_model, "native")
    assert native == _greedy_after_batched_prefill(tiny_model, "expand")


def test_unknown_mode_is_refused_with_the_choices(restore_mode) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match="TTSFLEET_PROMPT_GQA='fast'.*expand, native"):
        set_prompt_gqa("fast")
    assert model_layers.PROMPT_GQA_MODES == ("expand", "native")

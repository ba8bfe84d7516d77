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


class _SdpaCalls(torch.overrides.TorchFunctionMode):
    """Records what each ``scaled_dot_product_attention`` call was handed (and lets it run)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[dict] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls.append({"q_heads": args[0].shape[1], "kv_heads": args[1].shape[1],
                               "masked": kwargs.get("attn_mask") is not None,
                               "enable_gqa": kwargs.get("enable_gqa", False)})
        return func(*args, **kwargs)


@pytest.mark.parametrize("masked", [False, True])
def test_a_masked_call_expands_the_heads_and_an_unmasked_one_stays_native(restore_mode, masked: bool) -> None:  # noqa: ANN001
    """SDPA's memory-efficient kernel (the fused one that takes a mask) refuses ``enable_gqa``: a
    masked native call would run on the math kernel. Unmasked calls keep native GQA (flash)."""
    set_prompt_gqa("native")
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 5, 8, 16, generator=g)
    k, v = (torch.randn(1, 9, 2, 16, generator=g) for _ in range(2))
    mask = torch.ones(1, 1, 5, 9, dtype=torch.bool).tril(4) if masked else None
    with _SdpaCalls() as seen:
        attend(q, k if masked else k[:, :5], v if masked else v[:, :5], mask, causal=not masked)
    (call,) = seen.calls
    assert call["masked"] == masked
    assert (call["kv_heads"], call["enable_gqa"]) == ((8, False) if masked else (2, True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_masked_gqa_call_runs_on_the_memory_efficient_kernel(restore_mode, monkeypatch) -> None:  # noqa: ANN001
    """On CUDA with only the memory-efficient kernel allowed, the masked call still runs (native GQA
    with a mask would find no kernel) and equals the math kernel's result."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    set_prompt_gqa("native")
    g = torch.Generator(device="cuda").manual_seed(3)
    q = torch.randn(1, 384, 32, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k, v = (torch.randn(1, 512, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
    keys, rows = torch.arange(512, device="cuda"), torch.arange(384, device="cuda")
    mask = (keys[None, :] <= rows[:, None])[None, None]
    with sdpa_kernel(SDPBackend.MATH):
        ref = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, enable_gqa=True)
    monkeypatch.setattr(model_layers, "PROMPT_ATTENTION", [SDPBackend.EFFICIENT_ATTENTION])
    out = attend(q, k, v, mask)
    torch.testing.assert_close(out, ref.transpose(1, 2).reshape(1, 384, -1), rtol=2e-2, atol=2e-2)

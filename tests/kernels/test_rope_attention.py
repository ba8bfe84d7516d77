"""RoPE + KV store inside decode attention (``TTSFLEET_ROPE_ATTENTION=fused``; ``kernels/
triton_attention.py``'s ``_fused_q``), on CPU through Triton's interpreter (on a GPU, compiled).

What each test pins down, and how it can fail:
* the fused launch gives the separate pair's results bit for bit (``qkv_rope_store`` then
  ``decode_attention``): the attention output (bf16 / float32, or the FP8 codes + scales the O GEMM
  reads) and the whole K/V cache afterwards (dense, or FP8 codes + exponents), for one-pass and
  split attention (2 and 5 shares, so the row's position falls in different shares and some shares
  are empty), rows through slots with their own positions, and rows as slots at one shared position
  (the fast transformer's frame cache), with and without q/k norm. A share that stored its key
  twice or not at all, a query head rotated into the wrong row or un-interleaved, a missing barrier
  before the key loop (the interpreter runs a program's statements in order, so that one only
  shows on a GPU: the same test runs there), or a store at the wrong (slot, position) changes a bit;
* the cache outside each row's (slot, position) is untouched (NaN stays NaN);
* a fused request the attention kernel cannot take (a non-contiguous cache; float32 on CUDA) runs
  the separate RoPE + KV store launch and gives the separate path's results;
* on a GPU the q/k norm's sum over a head is reduced across a different thread layout (the
  separate kernel runs one warp per head, attention four): there the normed cases may differ by
  one bf16 rounding, and are compared within one bf16 ulp; everything else stays bit for bit.
* the switch: ``separate`` by default, bad values refused naming the choices; with ``separate`` the
  same call takes the two-launch path.
"""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.model_layers import rope_table
from ttsfleet.kernels import decode

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEV == "cuda" else torch.float32
H, KV, D, SLOTS, S = 8, 2, 64, 5, 150


def _case(rows_as_slots: bool, qk_norm: bool, fp8: bool, heads: int = H, kv: int = KV, d: int = D,  # noqa: ANN202
          dtype: torch.dtype = DTYPE):
    gen = torch.Generator().manual_seed(7)
    m = 3
    qkv = torch.randn(m, (heads + 2 * kv) * d, generator=gen).to(DEV, dtype)
    table = rope_table(S, d, 1e6).to(DEV, dtype)
    if rows_as_slots:  # the frame cache: row r is slot r, every row at position 4
        slots, pos = None, torch.tensor([4], device=DEV)
        lengths = torch.tensor([5], device=DEV)
    else:
        slots, pos = torch.tensor([3, 0, 4], device=DEV), torch.tensor([0, 77, 149], device=DEV)
        lengths = pos + 1
    k = torch.randn(SLOTS, S, kv, d, generator=gen).to(DEV, dtype)
    v = torch.randn(SLOTS, S, kv, d, generator=gen).to(DEV, dtype)
    ks = vs = None
    if fp8:
        from ttsfleet.kernels.reference import quantize_kv_ref

        (k, ks), (v, vs) = quantize_kv_ref(k), quantize_kv_ref(v)
    norms = ((torch.rand(d, generator=gen) + 0.5).to(DEV, dtype),
             (torch.rand(d, generator=gen) + 0.5).to(DEV, dtype)) if qk_norm else (None, None)
    return qkv, table, pos, slots, lengths, (k, v, ks, vs), norms


def _run(mode: str, case, group: int):  # noqa: ANN001, ANN202
    qkv, table, pos, slots, lengths, cache, norms = case
    k, v, ks, vs = (None if t is None else t.clone() for t in cache)
    kv, d = k.shape[-2:]
    decode.set_rope_attention(mode)
    heads = qkv.shape[-1] // d - 2 * kv  # qkv rows are q heads, then K and V heads
    out = decode.rope_attention(qkv, heads, d, table, pos, k, v, slots, lengths, *norms, eps=1e-6,
                                quant_group=group, k_scale=ks, v_scale=vs)
    outs = out if isinstance(out, tuple) else (out,)
    return [o.view(torch.uint8) if o.dtype == torch.float8_e4m3fn else o for o in outs], (k, v, ks, vs)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


#: (query heads, KV heads, head dim, dtype): the production-like case, and the tiny model's attention
#: (4 / 2 heads of 16: one 16-wide dot per block) in the device's kernel dtype.
SHAPES = {"h8kv2d64": (H, KV, D, DTYPE), "tiny": (4, 2, 16, DTYPE)}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("splits", ["off", "2", "5"])
@pytest.mark.parametrize("rows_as_slots", [False, True])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_fused_equals_the_separate_launches_bit_for_bit(kernels_on, splits, rows_as_slots, qk_norm,  # noqa: ANN001
                                                        shape) -> None:
    heads, kv, d, dtype = SHAPES[shape]
    decode.set_attn_splits(splits)
    case = _case(rows_as_slots, qk_norm, fp8=False, heads=heads, kv=kv, d=d, dtype=dtype)
    ref_out, ref_cache = _run("separate", case, 0)
    out, cache = _run("fused", case, 0)
    for a, b in zip(ref_out + list(ref_cache[:2]), out + list(cache[:2]), strict=True):
        if qk_norm and DEV == "cuda":
            torch.testing.assert_close(b, a, rtol=2.0**-7, atol=2.0**-7)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("splits", ["off", "3"])
@pytest.mark.parametrize("group", [0, 32, 64])
def test_fused_over_an_fp8_cache_into_fp8_codes(kernels_on, splits, group) -> None:  # noqa: ANN001
    decode.set_attn_splits(splits)
    case = _case(False, False, fp8=True)  # (no q/k norm: bit for bit on a GPU too)
    ref_out, ref_cache = _run("separate", case, group)
    out, cache = _run("fused", case, group)
    for a, b in zip(ref_out + [_bits(t) for t in ref_cache], out + [_bits(t) for t in cache], strict=True):
        assert torch.equal(a, b)


def test_only_each_rows_position_is_written(kernels_on) -> None:  # noqa: ANN001
    decode.set_attn_splits("4")
    qkv, table, pos, slots, lengths, (k, v, _, _), norms = _case(False, False, fp8=False)
    k, v = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    lengths = torch.ones_like(lengths)  # attend only key 0, which only the row at position 0 writes
    decode.set_rope_attention("fused")
    decode.rope_attention(qkv, H, D, table, pos, k, v, slots, lengths)
    written = torch.zeros(SLOTS, S, dtype=torch.bool, device=DEV)
    written[slots, pos] = True
    assert not k[written].isnan().any() and not v[written].isnan().any()
    assert k[~written].isnan().all() and v[~written].isnan().all()


#: Caches the attention kernel does not take (``decode.attention_kernel_fits``): one laid out head-major
#: (not contiguous; everywhere), and float32 on CUDA (its dots would round through TF32) — the case of
#: the whole-frame test that failed on an H200 on 2026-12-05 because it expected the fused form there.
FALLBACKS = ["head-major"] + (["float32-on-cuda"] if DEV == "cuda" else [])


@pytest.mark.parametrize("fallback", FALLBACKS)
def test_a_fused_request_the_kernel_cannot_take_runs_the_two_launches(kernels_on, fallback,  # noqa: ANN001
                                                                        monkeypatch) -> None:
    dtype = torch.float32 if fallback == "float32-on-cuda" else DTYPE
    qkv, table, pos, slots, lengths, (k, v, _, _), norms = _case(False, True, fp8=False, dtype=dtype)
    if fallback == "head-major":  # the same values in [slot, head, position, dim] memory order
        k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    assert not decode.attention_kernel_fits(qkv.new_empty(0, H, D), k, v)
    separate = []
    launch = decode.qkv_rope_store
    monkeypatch.setattr(decode, "qkv_rope_store", lambda *a, **kw: separate.append(1) or launch(*a, **kw))
    case = qkv, table, pos, slots, lengths, (k, v, None, None), norms
    ref_out, ref_cache = _run("separate", case, 0)
    assert len(separate) == 1
    out, cache = _run("fused", case, 0)
    assert len(separate) == 2, "the fused request did not take the separate RoPE + KV store launch"
    for a, b in zip(ref_out + list(ref_cache[:2]), out + list(cache[:2]), strict=True):
        assert torch.equal(a, b)


def test_the_switch_defaults_to_separate_and_names_its_choices() -> None:
    assert decode.ROPE_ATTENTION_SWITCH.default == "separate"
    assert decode.parse_rope_attention(" FUSED ") == "fused"
    with pytest.raises(ValueError, match="^TTSFLEET_ROPE_ATTENTION='both': expected one of separate, fused$"):
        decode.parse_rope_attention("both")

"""The FP8 KV cache (``new_cache(..., kv_dtype="fp8")``, off by default), checked on CPU.

What each test pins down, and how it can fail:

* the format: e4m3 codes with one power-of-two scale per head vector, every value within e4m3's
  rounding of its input, dequantized exactly (bf16 == float32);
* the store kernel writes the reference quantizer's codes and exponents bit for bit, and only at
  its rows' (slot, position); decode attention over an FP8 cache equals the reference over the
  dequantized cache (Triton's interpreter on CPU), and stays within a stated tolerance of attention
  over the unquantized cache (measured 2026-12-01, 2-core CPU VM: median 3.8 %, worst 5.2 % over 20
  random draws of 200 keys x 128 dims; bound 7 %);
* whole decode frames of the fused path equal the reference path's with an FP8 cache, codes equal;
* the greedy gate: ``tiny-fp8`` (trained-model-like margins, as ``test_fp8.py``'s gate) decodes the
  same first frames with an FP8 cache as with a bf16 one; logits of full-strength ``tiny`` within 5 %
  (measured 1.6 %), while a quantizer that picks its scale one power of two too small (values
  saturate) is caught;
* chunked prefill stores exactly the one-shot prefill's codes (what per-position scales buy);
* the memory: (D + 1) / (2 D) of a bf16 cache, exactly (S2 Pro: 50.4 %).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ttsfleet.inference import model as model_mod  # noqa: E402
from ttsfleet.inference.loader import load_model  # noqa: E402
from ttsfleet.inference.prompt import build_prompt  # noqa: E402
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams  # noqa: E402
from ttsfleet.kernels import dispatch  # noqa: E402
from ttsfleet.kernels.decode import decode_attention, decode_attention_ref  # noqa: E402
from ttsfleet.kernels.reference import (  # noqa: E402
    FP8,
    dequantize_kv,
    quantize_kv_ref,
    ue8m0_to_float,
)
from ttsfleet.kernels.testing import TOL_VS_UNQUANTIZED, rel_err  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
FUSED = "interpret" if DEV == "cpu" else "auto"


def _u8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.fixture
def kernels_on():  # noqa: ANN201
    """The Triton kernels (the interpreter on CPU); skipped where they cannot run."""
    pytest.importorskip("triton")
    from ttsfleet.kernels import triton_gemm

    if DEV == "cpu" and not triton_gemm.INTERPRETING:
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    dispatch.configure(FUSED)
    yield
    dispatch.configure()


def test_the_format_rounds_each_value_as_e4m3_and_dequantizes_exactly() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 40, 3, 128, generator=g) * torch.logspace(-3, 3, 40)[None, :, None, None]
    codes, exps = quantize_kv_ref(x)
    assert codes.dtype == FP8 and exps.dtype == torch.uint8 and exps.shape == x.shape[:-1]
    s = ue8m0_to_float(exps)
    ratio = x.abs().amax(-1) / s
    assert bool(((ratio > 224) & (ratio <= 448)).all()), "not the smallest power of two >= amax / 448"
    back = dequantize_kv(codes, exps, torch.float32)
    # e4m3: 3 mantissa bits (relative half-ulp 2^-4); below 2^-6 * s the subnormal step is 2^-9 * s
    assert bool(((back - x).abs() <= x.abs() * 2.0**-4 + s[..., None] * 2.0**-10).all())
    assert torch.equal(dequantize_kv(codes, exps, torch.bfloat16).float(), back), "bf16 dequantization rounds"


def test_a_bad_kv_dtype_or_a_mixed_cache_is_one_readable_error() -> None:
    model = load_model("tiny")
    with pytest.raises(ValueError, match="kv_dtype 'int8'"):
        model.new_cache(2, 16, kv_dtype="int8")
    cache = model.new_cache(2, 16, kv_dtype="fp8")
    q = torch.randn(1, model.config.n_head, model.config.head_dim)
    with pytest.raises(ValueError, match="needs its k_scale"):
        decode_attention(q, cache.k[0], cache.v[0], torch.tensor([0]), torch.tensor([3]))


def test_memory_is_d_plus_one_over_two_d_of_a_bf16_cache() -> None:
    model = load_model("tiny", dtype=torch.bfloat16)
    d = model.config.head_dim
    dense, fp8 = model.new_cache(3, 40), model.new_cache(3, 40, kv_dtype="fp8")
    assert fp8.kv_nbytes * 2 * d == dense.kv_nbytes * (d + 1)
    assert fp8.kv_nbytes == model.kv_bytes_per_position("fp8") * 3 * 40
    assert dense.kv_nbytes == model.kv_bytes_per_position() * 3 * 40
    from ttsfleet.inference.model_config import preset

    with torch.device("meta"):  # S2 Pro's shape, no weights
        s2 = model_mod.DualARModel(preset("s2-pro")).to(torch.bfloat16)
    ratio = s2.kv_bytes_per_position("fp8") / s2.kv_bytes_per_position()
    assert ratio == pytest.approx(129 / 256) and ratio < 0.51


def _sequential_cache(model, prompt: torch.Tensor, cuts: list[int], kv_dtype: str):  # noqa: ANN001, ANN202
    cache = model.new_cache(2, 64, kv_dtype=kv_dtype)
    start = 0
    for n in cuts:
        model.prefill(cache, 1, prompt[:, start:start + n], start=start)
        start += n
    return cache


def test_chunked_prefill_stores_exactly_the_one_shot_codes() -> None:
    """Scales per position: a chunk's codes do not depend on how the prompt was cut."""
    dispatch.configure("reference")
    try:
        model = load_model("tiny")
        g = torch.Generator().manual_seed(6)
        prompt = torch.randint(0, 500, (1 + model.config.num_codebooks, 13), generator=g)
        one = _sequential_cache(model, prompt, [13], "fp8")
        chunked = _sequential_cache(model, prompt, [5, 8], "fp8")
    finally:
        dispatch.configure()
    assert torch.equal(_u8(one.k[:, 1, :13]), _u8(chunked.k[:, 1, :13]))
    assert torch.equal(_u8(one.v[:, 1, :13]), _u8(chunked.v[:, 1, :13]))
    assert torch.equal(one.k_scale, chunked.k_scale) and torch.equal(one.v_scale, chunked.v_scale)
    torch.testing.assert_close(one.pending_logits, chunked.pending_logits, rtol=1e-4, atol=1e-4)


def test_the_store_kernel_writes_the_reference_codes_only_at_its_rows(kernels_on) -> None:  # noqa: ANN001
    from ttsfleet.inference.model_layers import rope_table
    from ttsfleet.kernels import triton_decode as td

    g = torch.Generator().manual_seed(2)
    h, kv, d, m, n_slots, s = 4, 2, 16, 16, 5, 20  # 32 head vectors at distinct (slot, position)
    qkv = (torch.randn(m, (h + 2 * kv) * d, generator=g) * 4).to(DEV)
    table = rope_table(s, d, 1e6).to(DEV)
    pos = torch.randperm(s, generator=g)[:m].to(DEV)
    slots = torch.randint(0, n_slots, (m,), generator=g).to(DEV)
    qn, kn = ((torch.rand(d, generator=g) + 0.5).to(DEV) for _ in range(2))
    kc, vc = (torch.zeros(n_slots, s, kv, d, device=DEV) for _ in range(2))
    q_dense = td.qkv_rope_store(qkv, h, kv, d, table, pos, kc, vc, slots, qn, kn, eps=1e-6)
    poison = torch.full((n_slots, s, kv, d), 0x7F, dtype=torch.uint8, device=DEV)  # e4m3 NaN
    k8, v8 = poison.clone().view(FP8), poison.clone().view(FP8)
    ks, vs = (torch.full((n_slots, s, kv), 255, dtype=torch.uint8, device=DEV) for _ in range(2))
    q = td.qkv_rope_store(qkv, h, kv, d, table, pos, k8, v8, slots, qn, kn, eps=1e-6, k_scale=ks, v_scale=vs)
    assert torch.equal(q, q_dense)
    for codes, exps, dense in ((k8, ks, kc), (v8, vs, vc)):
        want_q, want_e = quantize_kv_ref(dense[slots, pos])
        assert torch.equal(_u8(codes[slots, pos]), _u8(want_q)) and torch.equal(exps[slots, pos], want_e)
        written = torch.zeros(n_slots, s, dtype=torch.bool, device=DEV)
        written[slots, pos] = True
        assert bool((_u8(codes[~written]) == 0x7F).all()) and bool((exps[~written] == 255).all())


def _attention_inputs(d: int = 128):  # noqa: ANN202
    g = torch.Generator().manual_seed(0)
    kc = torch.randn(3, 200, 2, d, generator=g)
    vc = torch.randn(3, 200, 2, d, generator=g)
    q = torch.randn(2, 8, d, generator=g) * 2
    return q, kc, vc, torch.tensor([2, 0]), torch.tensor([5, 200])


def test_decode_attention_over_an_fp8_cache(kernels_on) -> None:  # noqa: ANN001
    q, kc, vc, slots, lengths = _attention_inputs()
    (kq, ke), (vq, ve) = quantize_kv_ref(kc), quantize_kv_ref(vc)
    dense = decode_attention_ref(q, kc, vc, slots, lengths)
    ref = decode_attention_ref(q, kq, vq, slots, lengths, ke, ve)
    torch.testing.assert_close(ref, decode_attention_ref(q, dequantize_kv(kq, ke, q.dtype),
                                                         dequantize_kv(vq, ve, q.dtype), slots, lengths))
    assert rel_err(ref, dense) < TOL_VS_UNQUANTIZED
    args = [t.to(DEV) for t in (q, kq, vq, slots, lengths)]
    got = decode_attention(*args, 0, ke.to(DEV), ve.to(DEV))  # the kernel
    torch.testing.assert_close(got.cpu(), ref, rtol=1e-5, atol=1e-5)
    (codes, scales), plain = decode_attention(*args, 32, ke.to(DEV), ve.to(DEV)), got  # O GEMM's codes
    from ttsfleet.kernels.reference import quantize_activation_ref

    want_q, want_s = quantize_activation_ref(plain.reshape(2, -1).cpu(), 32)
    assert torch.equal(_u8(codes.cpu()), _u8(want_q)) and torch.equal(scales.cpu(), want_s)


def test_fused_frames_with_an_fp8_cache_equal_the_reference_path(kernels_on) -> None:  # noqa: ANN001
    """The fused path (store kernel, FP8 decode attention, prefill reading the cache) against the
    torch reference (quantize_kv_ref on store, dequantize on read): the same frames and codes.
    4 codebooks instead of tiny's 10: the same kernels, fewer interpreted fast-model launches."""
    model = load_model("tiny", device=DEV, dtype=torch.float32, config_overrides={"num_codebooks": 4})
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 500, (1 + model.config.num_codebooks, 9), generator=g).to(DEV)
    params = [SamplingParams(seed=7 + i, top_k=30) for i in range(2)]
    runs = []
    for mode in ("reference", FUSED):
        dispatch.configure(mode)
        cache = model.new_cache(3, 32, kv_dtype="fp8")
        for slot in range(2):
            model.prefill(cache, slot, prompt)
        batch = SamplingBatch.from_params(params, DEV)
        window = torch.full((2, 16, model.config.num_codebooks), -1, dtype=torch.int32, device=DEV)
        frames = []
        for _ in range(3):
            f = model.decode_step(cache, torch.tensor([1, 0], device=DEV), batch, window)
            window = torch.cat([window[:, 1:], f[:, None, 1:].int()], dim=1)
            frames.append(f)
        runs.append((torch.stack(frames), cache))
    (ref, rc), (got, gc) = runs
    assert torch.equal(got, ref)
    assert torch.equal(_u8(gc.k), _u8(rc.k)) and torch.equal(_u8(gc.v), _u8(rc.v))
    assert torch.equal(gc.k_scale, rc.k_scale) and torch.equal(gc.v_scale, rc.v_scale)
    torch.testing.assert_close(gc.pending_logits, rc.pending_logits, rtol=1e-4, atol=1e-4)


def _gate_prompt(tok, cfg) -> torch.Tensor:  # noqa: ANN001
    gen = torch.Generator().manual_seed(42)
    ref = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, 6), generator=gen)
    return build_prompt(tok, cfg, "The quick brown fox.", references=[(ref, "a reference")])


FRAMES = 8


def test_greedy_frames_with_an_fp8_cache_equal_the_bf16_cache(tiny_tok) -> None:  # noqa: ANN001
    model = load_model("tiny-fp8", dtype=torch.bfloat16)
    prompt = _gate_prompt(tiny_tok, model.config)
    batch = SamplingBatch.from_params([SamplingParams(temperature=0.0)])
    frames = {}
    for kv in ("auto", "fp8"):
        cache = model.new_cache(1, 256, kv_dtype=kv)
        model.prefill(cache, 0, prompt)
        frames[kv] = [model.decode_step(cache, torch.tensor([0]), batch)[0].tolist() for _ in range(FRAMES)]
    assert frames["fp8"] == frames["auto"]


def _fp8_logit_error(model, prompt: torch.Tensor) -> float:  # noqa: ANN001
    out = []
    for kv in ("auto", "fp8"):
        cache = model.new_cache(1, 256, kv_dtype=kv)
        model.prefill(cache, 0, prompt)
        out.append(cache.pending_logits[0].clone())
    return rel_err(out[1], out[0])


def test_fp8_cache_logits_stay_close_and_a_saturating_scale_is_caught(tiny_tok,  # noqa: ANN001
                                                                       monkeypatch) -> None:  # noqa: ANN001
    model = load_model("tiny", dtype=torch.bfloat16)
    prompt = _gate_prompt(tiny_tok, model.config)
    assert _fp8_logit_error(model, prompt) < 0.05

    def one_power_too_small(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        _, exps = quantize_kv_ref(x)  # the right exponent, minus one: |x / s| reaches 896, clamps at 448
        s = ue8m0_to_float(exps - 1)
        return (x.float() / s[..., None]).clamp(-448, 448).to(FP8), exps - 1

    monkeypatch.setattr(model_mod, "quantize_kv_ref", one_power_too_small)
    assert _fp8_logit_error(model, prompt) > 0.05

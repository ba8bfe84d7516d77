"""The fused decode kernels against the reference path: each kernel, then whole frames.

On a machine without a GPU these run the Triton kernels in Triton's interpreter on CPU tensors
(``TRITON_INTERPRET=1`` set before triton is imported, the kernel dispatch in ``interpret`` mode); on
CUDA they run the compiled kernels. Skipped when triton is not installed.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.inference import fused  # noqa: E402
from ttsfleet.inference.loader import load_model  # noqa: E402
from ttsfleet.inference.model_layers import RMSNorm, apply_rope, rope_table  # noqa: E402
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams, sample, sample_main  # noqa: E402
from ttsfleet.kernels import dispatch  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
#: Triton's interpreter truncates float32 -> bf16 (CUDA rounds to nearest even): bf16 checks are GPU-only.
DTYPES = [torch.float32, torch.bfloat16] if DEV == "cuda" else [torch.float32]


FUSED = "interpret" if DEV == "cpu" else "auto"
#: Codebooks of the whole-frame tests' model (tiny has 10).
FAST_CODEBOOKS = 4


@pytest.fixture(autouse=True)
def _fused_on():  # noqa: ANN202
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("triton was imported before TRITON_INTERPRET could be set")
    dispatch.configure(FUSED)
    yield
    dispatch.configure()  # back to what TTSFLEET_KERNELS says


def _kernels():  # noqa: ANN202
    from ttsfleet.kernels import triton_decode

    return triton_decode


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_matches_the_module(dtype: torch.dtype, residual: bool) -> None:
    g = torch.Generator().manual_seed(1)
    norm = RMSNorm(96, 1e-6).to(DEV, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(96, generator=g) + 0.5)
    x = torch.randn(5, 96, generator=g).to(DEV, dtype)
    r = torch.randn(5, 96, generator=g).to(DEV, dtype) if residual else None
    y, h = _kernels().rmsnorm(x, norm.weight.detach(), norm.eps, r)
    h_ref = x + r if residual else x
    torch.testing.assert_close(h, h_ref, rtol=0, atol=0)
    # bf16: a reduction order apart, then two roundings -> at most 2 ulp (2^-6 relative)
    rtol = 1e-6 if dtype == torch.float32 else 2.0**-6
    torch.testing.assert_close(y, norm(h_ref).detach(), rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("qk_norm", [True, False])
@pytest.mark.parametrize("shared_slot", [False, True])
def test_qkv_rope_store_matches_reference(qk_norm: bool, shared_slot: bool) -> None:
    g = torch.Generator().manual_seed(2)
    h, kv, d, m, slots_n, s = 4, 2, 16, 3, 5, 12
    qkv = torch.randn(m, (h + 2 * kv) * d, generator=g).to(DEV)
    table = rope_table(s, d, 1e6).to(DEV)
    pos = torch.tensor([4] if shared_slot else [0, 7, 11], device=DEV)
    slots = None if shared_slot else torch.tensor([3, 0, 4], device=DEV)
    kc = torch.full((slots_n, s, kv, d), float("nan"), device=DEV)
    vc = kc.clone()
    qn = (torch.rand(d, generator=g) + 0.5).to(DEV) if qk_norm else None
    kn = (torch.rand(d, generator=g) + 0.5).to(DEV) if qk_norm else None
    q = _kernels().qkv_rope_store(qkv, h, kv, d, table, pos, kc, vc, slots, qn, kn, eps=1e-6)

    qr, kr, vr = qkv.split([h * d, kv * d, kv * d], dim=-1)
    qr, kr, vr = qr.view(m, 1, h, d), kr.view(m, 1, kv, d), vr.view(m, kv, d)
    if qk_norm:
        def norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        qr, kr = norm(qr, qn), norm(kr, kn)
    rows = pos.expand(m)
    rope = table[rows][:, None]
    torch.testing.assert_close(q, apply_rope(qr, rope)[:, 0], rtol=1e-5, atol=1e-5)
    dst = torch.arange(m, device=DEV) if slots is None else slots
    torch.testing.assert_close(kc[dst, rows], apply_rope(kr, rope)[:, 0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vc[dst, rows], vr, rtol=0, atol=0)
    written = torch.zeros(slots_n, s, dtype=torch.bool, device=DEV)
    written[dst, rows] = True
    assert torch.isnan(kc[~written]).all(), "the kernel wrote outside (slot, pos) of its rows"


def _batch(rows: list[SamplingParams]) -> SamplingBatch:
    return SamplingBatch.from_params(rows, DEV)


def _sampling_rows(n: int) -> list[SamplingParams]:
    temps, tops, ks = [0.8, 0.0, 1.2, 0.5], [0.8, 0.95, 0.3, 1.0], [30, 64, 5, 1]
    return [SamplingParams(temperature=temps[i % 4], top_p=tops[i % 3], top_k=ks[i % 4], seed=100 + i,
                           repetition_penalty=1.0 if i % 2 else 1.3) for i in range(n)]


@pytest.mark.parametrize("select", ["torch", "kernel"])
@pytest.mark.parametrize("vocab", [97, 4097])
def test_fused_sampler_draws_the_reference_tokens(vocab: int, select: str) -> None:
    """Same ids as the reference sampler on many rows, steps and draws (random logits have no ties),
    with the best logits picked by ``torch.topk`` or inside the one-launch kernel."""
    g = torch.Generator().manual_seed(3)
    bs = 12
    batch = _batch(_sampling_rows(bs))
    assert batch.fusable
    mismatches = total = 0
    for step_i in range(2):  # (the step seeds each row's draws: a second step draws anew)
        logits = (torch.randn(bs, vocab, generator=g) * 3).to(DEV)
        window = torch.randint(-1, vocab, (bs, 16), generator=g, dtype=torch.int32).to(DEV)
        step = torch.full((bs,), step_i, dtype=torch.int64, device=DEV)
        for draw in (1, 5):
            got = _kernels().sample_topk(logits, batch, step, draw, window, select=select)
            want = sample(logits, batch, step, draw, window)
            mismatches += int((got != want).sum())
            total += bs
        got = _kernels().sample_topk(logits, batch, step, 0, window, ras_end_index=vocab - 1, select=select)
        want = sample_main(logits, batch, step, window, end_index=vocab - 1)
        mismatches += int((got != want).sum())
        total += bs
    assert mismatches == 0, f"{mismatches}/{total} rows differ"


def test_in_kernel_top_k_cuts_exact_ties_as_the_reference() -> None:
    """Exact ties: the one-launch sampler ranks tied logits lower vocab index first, as the
    reference's stable sort does, so top-k and top-p cut the same tokens. Rows of a 0.5 grid (many
    ties, -inf columns) and all-equal rows, where top-k (7) and top-p (0.1 of 64 kept) cut inside
    one tie group: there the kept tokens, hence the draws, follow the tie order."""
    g = torch.Generator().manual_seed(9)
    bs, vocab = 16, 300
    batch = _batch([SamplingParams(temperature=1.0, top_p=(1.0, 0.9, 0.1)[i % 3], top_k=(64, 7, 33, 2)[i % 4],
                                   seed=i) for i in range(bs)])
    for step_i in range(4):
        logits = (torch.randn(bs, vocab, generator=g) * 2).round() / 2
        logits[:, ::7] = float("-inf")
        logits[::2] = 1.5  # all-equal rows
        logits = logits.to(DEV)
        step = torch.full((bs,), step_i, dtype=torch.int64, device=DEV)
        got = _kernels().sample_topk(logits, batch, step, 3, None, select="kernel")
        assert torch.equal(got, sample(logits, batch, step, 3, None)), f"step {step_i}"


def test_the_top_k_switch_is_checked() -> None:
    from ttsfleet.kernels import decode as kd

    with pytest.raises(ValueError, match="TTSFLEET_TOPK_SELECT='heap'"):
        kd.set_topk_select("heap")
    with pytest.raises(ValueError, match="top-k selection"):
        _kernels().sample_topk(torch.zeros(1, 8, device=DEV), _batch([SamplingParams()]),
                               torch.zeros(1, dtype=torch.int64, device=DEV), 0, select="heap")


@pytest.mark.parametrize("select", ["torch", "kernel"])
def test_repetition_aware_resampling_takes_the_hot_draw(select: str) -> None:
    """A main token that repeats within the window is redrawn (RAS), exactly as the reference does."""
    g = torch.Generator().manual_seed(4)
    bs, vocab = 8, 65
    batch = _batch([SamplingParams(temperature=0.8, top_p=0.9, top_k=20, seed=i) for i in range(bs)])
    logits = (torch.randn(bs, vocab, generator=g) * 0.5).to(DEV)
    step = torch.zeros(bs, dtype=torch.int64, device=DEV)
    normal = sample(logits, batch, step, 0, None)
    window = normal[:, None].repeat(1, 16).to(torch.int32)  # every row's normal draw is a repeat
    got = _kernels().sample_topk(logits, batch, step, 0, window, ras_end_index=vocab - 1, select=select)
    want = sample_main(logits, batch, step, window, end_index=vocab - 1)
    assert torch.equal(got, want)
    assert (got != normal).any(), "no row was resampled: the test does not exercise RAS"


def test_unfusable_rows_keep_the_reference_sampler() -> None:
    assert not _batch([SamplingParams(top_k=0), SamplingParams()]).fusable
    assert not _batch([SamplingParams(top_k=65)]).fusable
    assert _batch([SamplingParams(top_k=0, temperature=0.0)]).fusable  # greedy ignores top_k


#: The sampler's selection (``select``) is independent of the RoPE / launch switches: "kernel" runs in
#: the bf16 fused-RoPE and the FP8 one-launch cases, "torch" in the rest (the sampler's own tests above
#: compare both selections directly).
@pytest.mark.parametrize("fusable,quantize,select,rope,launches", [
    (True, "bf16", "torch", "separate", "separate"), (False, "bf16", "torch", "separate", "separate"),
    (True, "bsgemm_fp8", "torch", "separate", "separate"), (True, "mxfp8", "torch", "separate", "separate"),
    (True, "bf16", "kernel", "fused", "separate"),
    (True, "bsgemm_fp8", "torch", "fused", "separate"), (True, "bsgemm_fp8", "kernel", "fused", "one")])
def test_fused_decode_step_emits_the_reference_frames(fusable: bool, quantize: str, select: str, rope: str,
                                                      launches: str, request: pytest.FixtureRequest) -> None:
    """Whole frames (main token + 10 codes) of the fused path equal the reference path's; with FP8
    weights the fused norms / attention hand the GEMMs FP8 codes the reference quantizes itself.

    FP8 runs in the interpreter only: there both paths make bit-identical codes. Compiled, the
    norm's reduction order differs from torch's in the last bit, which moves an FP8 code at a
    rounding boundary and flips near-tied tokens of this random tiny model; at S2 Pro shape with
    trained-like margins ``test_gpu_s2pro_gate.py`` is the GPU's check of the same claim. ``mxfp8``
    is the RTX 5090 / 6000 PRO scheme: its whole fused path (1x32 codes from the norms and attention,
    the mxfp8 GEMM configs) runs here, the numerics half of the sm_120 path (``compile_check`` is the
    other half). ``select="kernel"``: the sampler selects its top-k inside its one launch.
    ``rope="fused"``: the RoPE + KV store inside decode attention's launch (slow and fast blocks).
    ``launches="one"``: every FP8 MLP of <= 64 rows (decode, and this short prompt's prefill) in one
    launch, and the fast model's attention half (QKV, RoPE + store, attention, O) in one."""
    if quantize != "bf16" and DEV == "cuda":
        pytest.skip("FP8 frames are compared bit-exactly in the interpreter; the S2 Pro gate covers the GPU")
    from ttsfleet.kernels import decode as kd

    kd.set_topk_select(select)
    request.addfinalizer(kd.TOPK_SELECT_SWITCH.reset)  # the environment's (or default) again
    kd.set_rope_attention(rope)
    request.addfinalizer(kd.ROPE_ATTENTION_SWITCH.reset)
    kd.set_mlp_launch("one" if launches == "one" else "two")
    request.addfinalizer(kd.MLP_LAUNCH_SWITCH.reset)
    kd.set_fast_attn_launch(launches)
    request.addfinalizer(kd.FAST_ATTN_LAUNCH_SWITCH.reset)
    separate_calls = []  # the separate RoPE + KV store kernel's launches during decode steps
    launch = _kernels().qkv_rope_store

    def counted(*args: object, **kwargs: object) -> torch.Tensor:
        separate_calls.append(1)
        return launch(*args, **kwargs)

    request.getfixturevalue("monkeypatch").setattr(_kernels(), "qkv_rope_store", counted)
    one_launch_calls = _count_one_launches(request.getfixturevalue("monkeypatch"))
    # tiny with 4 codebooks instead of 10: the interpreter runs every fast-model launch per codebook in
    # Python, and 4 positions take the same kernels (one <= 16-key block of the frame cache) as 10
    model = load_model("tiny", device=DEV, dtype=torch.float32, quantize=quantize,
                       config_overrides={"num_codebooks": FAST_CODEBOOKS})
    assert model.config.num_codebooks == FAST_CODEBOOKS
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 500, (1 + model.config.num_codebooks, 9), generator=g)
    bs, steps = 3, 2  # the second step attends over the first's fused KV store
    params = [SamplingParams(seed=7 + i, top_k=30 if fusable else 0) for i in range(bs)]
    frames = {}
    for mode in ("reference", FUSED):
        dispatch.configure(mode)
        cache = model.new_cache(bs + 1, 64)
        for slot in range(bs):
            model.prefill(cache, slot, prompt.to(DEV))
        batch = SamplingBatch.from_params(params, DEV)
        window = torch.full((bs, 16, model.config.num_codebooks), -1, dtype=torch.int32, device=DEV)
        slots = torch.tensor([2, 0, 1], device=DEV)
        out = []
        separate_calls.clear()  # (prefill's causal attention keeps the separate kernel)
        for _ in range(steps):
            f = model.decode_step(cache, slots, batch, window)
            window = torch.cat([window[:, 1:], f[:, None, 1:].int()], dim=1)
            out.append(f)
        frames[mode] = (torch.stack(out), cache.lengths.clone(), cache.pending_logits.clone())
    # the fused decode path launches it per block unless the RoPE runs inside attention, which it
    # can only where the attention kernel runs: not for this float32 model on CUDA (its dots would
    # round through TF32), where a fused request takes the separate launches (found on an H200,
    # 2026-12-05: the test expected the fused form there)
    attention_kernel = _attention_kernel_runs(model, cache)
    assert (len(separate_calls) == 0) == (rope == "fused" and attention_kernel), len(separate_calls)
    # FP8 MLPs of <= 64 rows take one launch exactly when on; the fast model's attention halves too,
    # where the attention kernel runs
    one = launches == "one" and quantize != "bf16"
    assert ("mlp" in one_launch_calls) == one, one_launch_calls
    # per decode step: every fast layer at every codebook position (a prefill has no frame cache)
    per_step = model.config.n_fast_layer * model.config.num_codebooks
    want = steps * per_step if one and attention_kernel else 0
    assert one_launch_calls.count("fast attention") == want, one_launch_calls
    (ref, ref_len, ref_logits), (got, got_len, got_logits) = frames.values()
    assert torch.equal(got, ref)
    assert torch.equal(got_len, ref_len)
    torch.testing.assert_close(got_logits, ref_logits, rtol=1e-4, atol=1e-4)


def _attention_kernel_runs(model, cache) -> bool:  # noqa: ANN001
    """Whether decode attention runs the Triton kernel on this device for the slow and the fast
    model's heads (queries and caches in the cache's dtype: the model's)."""
    from ttsfleet.kernels import decode as kd

    k, v, _, _ = cache.layer(0)
    cfg = model.config
    heads = ((cfg.n_head, cfg.head_dim), (cfg.fast_n_head, cfg.fast_head_dim))
    cache_like = [(k.new_empty(0, h, d), k.new_empty(1, 1, 1, d), v.new_empty(1, 1, 1, d)) for h, d in heads]
    return all(kd.attention_kernel_fits(*shapes) for shapes in cache_like)


def _count_one_launches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each one-launch MLP (``kernels.triton_mlp.swiglu_mlp_one_launch``) and fast attention half
    (``kernels.decode.frame_attention_block``) call."""
    from ttsfleet.kernels import decode, triton_mlp

    calls: list[str] = []
    for module, name, kind in ((triton_mlp, "swiglu_mlp_one_launch", "mlp"),
                               (decode, "frame_attention_block", "fast attention")):
        real = getattr(module, name)

        def counted(*args: object, _real=real, _kind=kind, **kwargs: object) -> torch.Tensor:  # noqa: ANN001
            calls.append(_kind)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


def test_fused_path_is_off_in_reference_mode() -> None:
    dispatch.configure("reference")
    assert not fused.fused_enabled(torch.zeros(1, device=DEV))
    dispatch.configure(FUSED)
    assert fused.fused_enabled(torch.zeros(1, device=DEV))


def test_fused_chunked_prefill_matches_the_reference_prefill() -> None:
    """The fused prefill, fed as two chunks (the masked path), leaves the slot as the reference one does."""
    model = load_model("tiny", device=DEV, dtype=torch.float32)
    g = torch.Generator().manual_seed(6)
    prompt = torch.randint(0, 500, (1 + model.config.num_codebooks, 11), generator=g).to(DEV)
    caches = []
    for mode, cuts in (("reference", [11]), (FUSED, [4, 7])):
        dispatch.configure(mode)
        cache = model.new_cache(3, 32)
        start = 0
        for n in cuts:
            model.prefill(cache, 1, prompt[:, start:start + n], start=start)
            start += n
        caches.append(cache)
    ref, got = caches
    assert torch.equal(got.lengths, ref.lengths) and int(got.lengths[1]) == 11
    torch.testing.assert_close(got.k[:, 1, :11], ref.k[:, 1, :11], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.v[:, 1, :11], ref.v[:, 1, :11], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got.pending_logits[1], ref.pending_logits[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.pending_hidden[1], ref.pending_hidden[1], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("residual", [False, True])
def test_rmsnorm_emits_the_codes_the_quantizer_would(group: int, residual: bool) -> None:
    """The norm's FP8 output is bit for bit ``quantize_activation`` of its ordinary output."""
    from ttsfleet.kernels.reference import quantize_activation_ref

    g = torch.Generator().manual_seed(7)
    d = 320  # 2.5 groups of 128: a partial last group
    w = (torch.rand(d, generator=g) + 0.5).to(DEV)
    x = (torch.randn(4, d, generator=g) * 3).to(DEV)
    r = torch.randn(4, d, generator=g).to(DEV) if residual else None
    (codes, scales), h = _kernels().rmsnorm(x, w, 1e-6, r, quant_group=group)
    y, h_plain = _kernels().rmsnorm(x, w, 1e-6, r)
    want_q, want_s = quantize_activation_ref(y.cpu(), group)
    assert torch.equal(h, h_plain)
    assert torch.equal(codes.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.cpu().view(torch.uint8), want_s.view(torch.uint8))


@pytest.mark.parametrize("d,group", [(128, 128), (64, 32), (128, 32)])
def test_decode_attention_emits_the_codes_the_quantizer_would(d: int, group: int) -> None:
    from ttsfleet.kernels.decode import decode_attention
    from ttsfleet.kernels.reference import quantize_activation_ref

    g = torch.Generator().manual_seed(8)
    dt = torch.bfloat16 if DEV == "cuda" else torch.float32  # (the kernel runs bf16 on CUDA)
    kc = torch.randn(3, 40, 2, d, generator=g).to(DEV, dt)
    vc = torch.randn(3, 40, 2, d, generator=g).to(DEV, dt)
    q = torch.randn(2, 8, d, generator=g).to(DEV, dt)
    slots, lengths = torch.tensor([2, 0], device=DEV), torch.tensor([5, 40], device=DEV)
    plain = decode_attention(q, kc, vc, slots, lengths)
    codes, scales = decode_attention(q, kc, vc, slots, lengths, group)
    want_q, want_s = quantize_activation_ref(plain.reshape(2, -1).cpu(), group)
    assert torch.equal(codes.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(scales.cpu().view(torch.uint8), want_s.view(torch.uint8))

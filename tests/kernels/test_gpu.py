"""GPU tests (sm_90 Triton path): numerics vs float64, every launch config, poisoned outputs,
split-K determinism, CUDA-graph capture/replay. Skipped cleanly without CUDA (the conftest marks
them); triton is imported only inside the tests."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from ttsfleet.kernels import (  # noqa: E402
    QuantizedWeight,
    linear_fp8,
    prev_tokens_shift_,
    quantize_activation,
    quantize_weight,
    swiglu_mlp_fp8,
)
from ttsfleet.kernels.check import f64_same_codes, run_checks  # noqa: E402
from ttsfleet.kernels.reference import (  # noqa: E402
    dequantize_activation,
    quantize_activation_ref,
    swiglu_mlp_fp8_ref,
)
from ttsfleet.kernels.testing import (  # noqa: E402
    TOL_MLP_VS_UNQUANTIZED,
    TOL_SAME_CODES_BF16,
    TOL_SAME_CODES_F32,
    randn,
    rel_err,
)
from ttsfleet.kernels.workspaces import new_owner, workspace_scope  # noqa: E402

pytestmark = pytest.mark.gpu
SCHEMES = ["bsgemm_fp8", "mxfp8"]


@pytest.fixture(autouse=True)
def _needs_sm90():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from ttsfleet.kernels import dispatch

    if not dispatch.plan("cuda").fused:
        pytest.skip("the catalog does not run the Triton kernels on this GPU")


def _gemm():
    from ttsfleet.kernels import triton_gemm

    return triton_gemm


CONFIGS = [
    dict(bn=64, split_k=1, swap=True),
    dict(bn=64, split_k=4, swap=True, tma=True, num_stages=6),
    dict(bn=128, split_k=2, swap=False),
    dict(bn=256, split_k=8, swap=True, prequant=True, num_stages=3),
    dict(bn=128, split_k=3, swap=True, bm=64, num_warps=8, num_stages=3, tma=True),
]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
@pytest.mark.parametrize("m,n,k", [(1, 256, 512), (3, 200, 384), (17, 320, 1000), (70, 6144, 2560)])
def test_gemm_configs_vs_float64(gen, scheme, cfg, m, n, k):
    tg = _gemm()
    w = randn(gen, n, k, scale=k ** -0.5, device="cuda")
    qw = quantize_weight(w, scheme)
    x = randn(gen, m, k, device="cuda", dtype=torch.bfloat16)
    bias = randn(gen, n, device="cuda", dtype=torch.bfloat16)
    c = tg.GemmConfig(**cfg)
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    if c.prequant:
        xq, xs = quantize_activation(x, 32 if scheme == "mxfp8" else 128)
        tg.launch_gemm(xq, xs, qw, out, bias, c)
    else:
        tg.launch_gemm(x, None, qw, out, bias, c)
    ref = f64_same_codes(x, qw) + bias.double().cpu()
    assert rel_err(out, ref) < TOL_SAME_CODES_BF16
    again = torch.full_like(out, float("nan"))
    if c.prequant:
        tg.launch_gemm(xq, xs, qw, again, bias, c)
    else:
        tg.launch_gemm(x, None, qw, again, bias, c)
    assert torch.equal(out, again)  # split-K sums in a fixed order: deterministic


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 5, 64, 128, 300])
def test_linear_fp8_public(gen, scheme, m):
    n, k = 2560, 4096
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5, device="cuda"), scheme)
    x = randn(gen, m, k, device="cuda", dtype=torch.float32)
    out = linear_fp8(x, qw)
    assert out.dtype == torch.float32
    assert rel_err(out, f64_same_codes(x, qw)) < TOL_SAME_CODES_F32


@pytest.mark.parametrize("block", [128, 32])
@pytest.mark.parametrize("m,k", [(1, 2560), (7, 1000), (64, 9728)])
def test_quantize_activation_bit_exact(gen, block, m, k):
    x = randn(gen, m, k, scale=5.0, device="cuda", dtype=torch.bfloat16)
    x[0, :7] = 0.0  # a partly zero group still matches
    q, s = quantize_activation(x, block)
    rq, rs = quantize_activation_ref(x.cpu(), block)
    assert torch.equal(q.cpu().view(torch.uint8), rq.view(torch.uint8))
    assert torch.equal(s.cpu().view(torch.uint8), rs.view(torch.uint8))


@pytest.mark.parametrize("scheme,bn", [("bsgemm_fp8", 128), ("mxfp8", 64), ("mxfp8", 128)])
@pytest.mark.parametrize("m", [1, 3, 64, 130])
def test_swiglu_fused_vs_reference(gen, scheme, m, bn):
    tg = _gemm()
    d, f = 2560, 9728 if m < 100 else 1000
    gu = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device="cuda"), scheme)
    dn = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device="cuda"), scheme)
    x = randn(gen, m, d, device="cuda", dtype=torch.bfloat16)
    tg.set_config("swiglu", m, 2 * f, d, tg.GemmConfig(bn=bn, split_k=2))
    try:
        out = swiglu_mlp_fp8(x, gu, dn)
    finally:
        tg.set_config("swiglu", m, 2 * f, d, None)
    ref = swiglu_mlp_fp8_ref(x.cpu(), gu.to("cpu"), dn.to("cpu"))
    assert rel_err(out, ref) < 1.5e-2  # same math and groups; h codes may differ by one FP8 step
    xd = x.double().cpu()
    from ttsfleet.kernels.reference import dequantize_weight

    gud = dequantize_weight(gu.to("cpu")).double()
    full = (torch.nn.functional.silu(xd @ gud[:f].t()) * (xd @ gud[f:].t())) @ \
        dequantize_weight(dn.to("cpu")).double().t()
    assert rel_err(out, full) < TOL_MLP_VS_UNQUANTIZED


def test_swiglu_epilogue_writes_quantized_h(gen):
    """The fused epilogue's FP8 h (codes + 1x128 scales) dequantizes to silu(g) * u."""
    tg = _gemm()
    m, d, f = 5, 512, 640
    gu = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device="cuda"), "bsgemm_fp8")
    x = randn(gen, m, d, device="cuda", dtype=torch.bfloat16)
    hq = torch.full((m, f), float("nan"), device="cuda").to(torch.float8_e4m3fn)
    hs = torch.full((m, f // 128), float("nan"), device="cuda")
    tg.launch_gemm(x, None, gu, hq, None, tg.GemmConfig(bn=128, split_k=2), epi=1, h_scale=hs)
    gu64 = f64_same_codes(x, gu)
    h = torch.nn.functional.silu(gu64[:, :f]) * gu64[:, f:]
    assert rel_err(dequantize_activation(hq.cpu(), hs.cpu()), h) < 5e-2
    assert hq.float().abs().amax(dim=1).cpu().eq(448).all()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_scale_strides_honoured_on_gpu(gen, scheme):
    w = randn(gen, 256, 512, scale=0.05) * torch.logspace(-2, 2, 512)
    qw = quantize_weight(w.cuda(), scheme)
    x = randn(gen, 4, 512, device="cuda", dtype=torch.bfloat16)
    kmajor = QuantizedWeight(qw.qweight, qw.scale.t().contiguous().t(), scheme, qw.shape)
    assert torch.equal(linear_fp8(x, qw), linear_fp8(x, kmajor))


def test_window_kernel(gen):
    for bs, w, cw in [(1, 1, 1), (4, 8, 10), (2, 300, 9)]:
        prev = torch.randint(-(2**31), 2**31 - 1, (bs, w, cw), generator=gen, dtype=torch.int64)
        prev = prev.to(torch.int32)
        ref = prev.clone()
        prev = prev.cuda()
        for _ in range(w + 2):
            nxt = torch.randint(0, 4096, (bs, cw), generator=gen, dtype=torch.int32)
            prev_tokens_shift_(prev, nxt.cuda())
            ref = torch.cat([ref[:, 1:], nxt[:, None]], dim=1)
        assert torch.equal(prev.cpu(), ref)
    with pytest.raises(ValueError):
        prev_tokens_shift_(prev, prev[:, 0].long())


def test_cuda_graph_capture_and_replay(gen):
    """Everything captures into one graph; replays with new inputs match eager runs (tickets reset)."""
    d, f = 2560, 9728
    gu = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device="cuda"), "bsgemm_fp8")
    dn = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device="cuda"), "bsgemm_fp8")
    qkv = quantize_weight(randn(gen, 6144, d, scale=d ** -0.5, device="cuda"), "bsgemm_fp8")
    x = randn(gen, 8, d, device="cuda", dtype=torch.bfloat16)
    win = torch.zeros(8, 16, 10, dtype=torch.int32, device="cuda")
    nxt = torch.randint(0, 100, (8, 10), generator=gen, dtype=torch.int32).cuda()

    def step():
        return swiglu_mlp_fp8(x, gu, dn), linear_fp8(x, qkv), prev_tokens_shift_(win, nxt)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with workspace_scope(new_owner("test-step")):  # the graph shares the warm-up's workspaces
        with torch.cuda.stream(s):
            step()  # warm-up: compile, workspaces
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            y_mlp, y_qkv, _ = step()
    for _ in range(3):
        x.copy_(randn(gen, 8, d, device="cuda", dtype=torch.bfloat16))
        nxt.copy_(torch.randint(0, 100, (8, 10), generator=gen, dtype=torch.int32))
        win_before = win.clone()
        g.replay()
        torch.cuda.synchronize()
        e_mlp, e_qkv = swiglu_mlp_fp8(x, gu, dn), linear_fp8(x, qkv)
        assert torch.equal(y_mlp, e_mlp) and torch.equal(y_qkv, e_qkv)
        assert torch.equal(win[:, :-1], win_before[:, 1:]) and torch.equal(win[:, -1], nxt)


def test_check_battery_passes_on_gpu():
    failed = [r for r in run_checks("cuda") if not r.ok]
    assert not failed, failed


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("m", [1, 37])
def test_swiglu_prequant_path(gen, scheme, m):
    """The two-launch variant (separate activation quantizer, FP8 A through shared memory)."""
    tg = _gemm()
    d, f = 2560, 9728
    gu = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device="cuda"), scheme)
    dn = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device="cuda"), scheme)
    x = randn(gen, m, d, device="cuda", dtype=torch.bfloat16)
    tg.set_config("swiglu", m, 2 * f, d, tg.GemmConfig(bn=128, split_k=2, prequant=True))
    try:
        out = swiglu_mlp_fp8(x, gu, dn)
    finally:
        tg.set_config("swiglu", m, 2 * f, d, None)
    assert rel_err(out, swiglu_mlp_fp8_ref(x.cpu(), gu.to("cpu"), dn.to("cpu"))) < 1.5e-2

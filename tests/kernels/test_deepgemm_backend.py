"""``TTSFLEET_DECODE_GEMM=deepgemm``: decode-size GEMMs on FP8 codes through DeepGEMM (issue #26).

Why each test: DeepGEMM is built on the GPU machine only, so here (1) choosing it where it does not
import must be the switch's one-line error, at serve start as for a misspelt value, never a traceback in
a decode step; (2) the routing — which GEMMs go to it, with which operands — is checked against a
stand-in ``deep_gemm`` computing the contract's reference math (the real module cannot run without a
GPU); (3) on a GPU with DeepGEMM built, its outputs are checked against the same-codes reference.
"""

from __future__ import annotations

import os
import sys
import types

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.kernels import decode, deepgemm_fp8  # noqa: E402
from ttsfleet.kernels.layout import QuantizedWeight  # noqa: E402
from ttsfleet.kernels.ops import linear_fp8_codes, quantize_weight, swiglu_mlp_fp8_codes  # noqa: E402
from ttsfleet.kernels.reference import (  # noqa: E402
    linear_fp8_codes_ref,
    quantize_activation_ref,
    swiglu_mlp_fp8_codes_ref,
)
from ttsfleet.kernels.testing import randn, rel_err  # noqa: E402

CUDA = torch.cuda.is_available()


@pytest.fixture(autouse=True)
def _fresh_module_lookup():
    deepgemm_fp8._module.cache_clear()
    yield
    deepgemm_fp8._module.cache_clear()
    decode.DECODE_GEMM_SWITCH.reset()
    decode.DEEPGEMM_ROWS_SWITCH.reset()
    decode.DEEPGEMM_SHAPES_SWITCH.reset()
    decode.DEEPGEMM_SMS_SWITCH.reset()


def _stand_in(calls: list[tuple]) -> types.ModuleType:
    """A ``deep_gemm`` whose ``fp8_gemm_nt`` computes the contract's reference on the operands it is
    handed (codes, float32 scales, weight codes and scales, a bf16 out of the right shape) and records
    them."""
    module = types.ModuleType("deep_gemm")

    def fp8_gemm_nt(a, b, out):  # noqa: ANN001, ANN202
        (aq, as_), (bq, bs) = a, b
        calls.append((tuple(aq.shape), aq.dtype, as_.dtype, tuple(bq.shape), tuple(bs.shape), out.dtype))
        qw = QuantizedWeight(qweight=bq, scale=bs, scheme="bsgemm_fp8", shape=tuple(bq.shape))
        out.copy_(linear_fp8_codes_ref(aq, as_.contiguous(), qw, torch.float32))

    module.fp8_gemm_nt = fp8_gemm_nt
    module.num_sms = 132  # DeepGEMM's default: the device's
    module.get_num_sms = lambda: module.num_sms
    module.set_num_sms = lambda n: setattr(module, "num_sms", n)
    return module


@pytest.mark.skipif(deepgemm_fp8.unavailable() == "", reason="deep_gemm imports here: nothing to refuse")
def test_choosing_it_without_deepgemm_is_the_switchs_one_line_error():
    from ttsfleet.inference.serve_config import _check_process_switches

    from ttsfleet.errors import UserError

    with pytest.raises(ValueError, match=r"TTSFLEET_DECODE_GEMM=deepgemm: DeepGEMM cannot run here \("):
        decode.set_decode_gemm("deepgemm")
    assert decode.decode_gemm() == "fp8"  # the value in force stays
    with pytest.raises(UserError, match="DeepGEMM cannot run here") as err:
        _check_process_switches({"TTSFLEET_DECODE_GEMM": "deepgemm"})
    assert "\n" not in str(err.value)


def test_decode_rows_go_to_deepgemm_with_our_operands_and_prefill_rows_do_not(gen, kernels_on, monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _stand_in(calls))
    decode.set_decode_gemm("deepgemm")
    n, k = 256, 384
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5), "bsgemm_fp8")
    x = randn(gen, 5, k)
    xq, xs = quantize_activation_ref(x, 128)
    bias = randn(gen, n)
    out = linear_fp8_codes(xq, xs, qw, torch.bfloat16, bias)
    scales = (n // 128, k // 128)
    assert calls == [((5, k), torch.float8_e4m3fn, torch.float32, (n, k), scales, torch.bfloat16)]
    want = linear_fp8_codes_ref(xq, xs, qw, torch.float32, bias)
    assert out.dtype == torch.bfloat16 and rel_err(out, want) < 1e-2
    big = decode.DECODE_GEMM_MAX_ROWS + 1
    bq, bs = quantize_activation_ref(randn(gen, big, k), 128)
    linear_fp8_codes(bq, bs, qw, torch.bfloat16)
    assert len(calls) == 1, "a prefill piece past the decode rows keeps the FP8 path"


def test_the_mlp_is_gate_up_then_codes_then_down_through_deepgemm(gen, kernels_on, monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _stand_in(calls))
    decode.set_decode_gemm("deepgemm")
    d, f = 256, 384
    # on a GPU machine on the GPU: silu(g) * u is quantized by a Triton launch, which (outside the CPU
    # interpreter) cannot read host tensors (2026-12-07e, H100: "cannot be accessed from Triton")
    device = "cuda" if CUDA else "cpu"
    gate_up = quantize_weight(randn(gen, 2 * f, d, scale=d ** -0.5, device=device), "bsgemm_fp8")
    down = quantize_weight(randn(gen, d, f, scale=f ** -0.5, device=device), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, 3, d, device=device), 128)
    out = swiglu_mlp_fp8_codes(xq, xs, gate_up, down, torch.bfloat16)
    assert [c[3] for c in calls] == [(2 * f, d), (d, f)], "gate_up, then down, each one call"
    # gate_up leaves in bf16 before silu(g) * u is quantized (as the cuBLAS path): a few codes differ
    assert rel_err(out, swiglu_mlp_fp8_codes_ref(xq, xs, gate_up, down, torch.float32)) < 3e-2


@pytest.mark.skipif(not CUDA or deepgemm_fp8.unavailable() != "", reason="needs a GPU with DeepGEMM built")
@pytest.mark.parametrize(("n", "k", "m"), [(6144, 2560, 1), (2560, 4096, 16), (2560, 9728, 64)])
def test_deepgemm_on_the_gpu_matches_the_same_codes_reference(gen, n, k, m, kernels_on):
    decode.set_decode_gemm("deepgemm")
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5, device="cuda"), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, m, k, device="cuda"), 128)
    out = linear_fp8_codes(xq, xs, qw, torch.bfloat16)
    assert rel_err(out, linear_fp8_codes_ref(xq, xs, qw, torch.float32)) < 1e-2


@pytest.mark.skipif(not CUDA or deepgemm_fp8.unavailable() != "", reason="needs a GPU with DeepGEMM built")
def test_deepgemm_replays_from_a_cuda_graph_as_it_runs_eagerly(gen, kernels_on):
    """The served path replays every decode GEMM from CUDA graphs captured after an eager warm-up (its
    JIT compile then, not in the capture): the replay on new codes must give the eager output."""
    from ttsfleet.inference.graph_capture import capture_after_warmup

    decode.set_decode_gemm("deepgemm")
    n, k, m = 2560, 4096, 16
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5, device="cuda"), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, m, k, device="cuda"), 128)
    graph, out = capture_after_warmup(lambda: linear_fp8_codes(xq, xs, qw, torch.bfloat16))
    fresh_q, fresh_s = quantize_activation_ref(randn(gen, m, k, device="cuda"), 128)
    xq.copy_(fresh_q)
    xs.copy_(fresh_s)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, linear_fp8_codes(xq, xs, qw, torch.bfloat16))


def test_the_rows_window_keeps_the_other_sizes_on_their_usual_kernel(gen, kernels_on, monkeypatch):
    """``TTSFLEET_DEEPGEMM_ROWS=4-8``: a 5-row GEMM goes to DeepGEMM, 2 and 9 rows stay ours — with the
    reference's output either way."""
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _stand_in(calls))
    decode.set_decode_gemm("deepgemm")
    decode.set_deepgemm_rows("4-8")
    n, k = 128, 256
    qw = quantize_weight(randn(gen, n, k, scale=k ** -0.5), "bsgemm_fp8")
    for rows in (2, 5, 9):
        xq, xs = quantize_activation_ref(randn(gen, rows, k), 128)
        out = linear_fp8_codes(xq, xs, qw, torch.float32)
        assert rel_err(out, linear_fp8_codes_ref(xq, xs, qw, torch.float32)) < 1e-2
    assert [c[0][0] for c in calls] == [5], "only the rows inside the window reach DeepGEMM"


def test_the_sms_switch_sizes_deepgemms_grid_and_all_gives_the_device_back(gen, kernels_on, monkeypatch):
    """``TTSFLEET_DEEPGEMM_SMS=100``: DeepGEMM is handed 100 SMs before its GEMM; a count past the device's
    is cut to the device's; ``all`` after a count hands the device's back (a process A/Bs both)."""
    calls: list[tuple] = []
    dg = _stand_in(calls)
    dg.num_sms = total = decode.sm_count(torch.device("cuda" if CUDA else "cpu"))
    monkeypatch.setitem(sys.modules, "deep_gemm", dg)
    decode.set_decode_gemm("deepgemm")
    device = "cuda" if CUDA else "cpu"
    qw = quantize_weight(randn(gen, 128, 256, scale=256 ** -0.5, device=device), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, 4, 256, device=device), 128)
    seen = []
    for sms in ("all", "100", str(total + 50), "all"):
        decode.set_deepgemm_sms(sms)
        linear_fp8_codes(xq, xs, qw, torch.bfloat16)
        seen.append(dg.num_sms)
    assert seen == [total, min(100, total), total, total] and len(calls) == 4
    with pytest.raises(ValueError, match=r"TTSFLEET_DEEPGEMM_SMS='0': expected all or a count 1..1024"):
        decode.set_deepgemm_sms("0")


def test_the_shapes_list_keeps_the_other_weights_on_their_usual_kernel(gen, kernels_on, monkeypatch):
    """``TTSFLEET_DEEPGEMM_SHAPES=256x128``: the 256 x 128 weight's GEMM goes to DeepGEMM, the 128 x 256
    one stays ours, and an MLP whose down weight (128 x 128) is not listed stays ours whole — with the
    reference's output either way."""
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _stand_in(calls))
    decode.set_decode_gemm("deepgemm")
    decode.set_deepgemm_shapes("256x128")
    listed = quantize_weight(randn(gen, 256, 128, scale=128 ** -0.5), "bsgemm_fp8")
    other = quantize_weight(randn(gen, 128, 256, scale=256 ** -0.5), "bsgemm_fp8")
    for qw in (listed, other):
        xq, xs = quantize_activation_ref(randn(gen, 3, qw.shape[1]), 128)
        out = linear_fp8_codes(xq, xs, qw, torch.float32)
        assert rel_err(out, linear_fp8_codes_ref(xq, xs, qw, torch.float32)) < 1e-2
    assert [c[3] for c in calls] == [(256, 128)], "only the listed shape reaches DeepGEMM"
    calls.clear()
    down = quantize_weight(randn(gen, 128, 128, scale=128 ** -0.5), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, 3, 128), 128)
    out = swiglu_mlp_fp8_codes(xq, xs, listed, down, torch.float32)
    assert calls == [], "gate_up listed but down not: the MLP stays ours"
    assert rel_err(out, swiglu_mlp_fp8_codes_ref(xq, xs, listed, down, torch.float32)) < 1e-2
    decode.set_deepgemm_shapes("all")
    assert decode.deepgemm_shapes() is None


def test_a_partial_block_keeps_our_kernel(gen, kernels_on, monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _stand_in(calls))
    decode.set_decode_gemm("deepgemm")
    qw = quantize_weight(randn(gen, 192, 64, scale=0.1), "bsgemm_fp8")  # N = 1.5 blocks, K = half of one
    xq, xs = quantize_activation_ref(randn(gen, 2, 64), 128)
    out = linear_fp8_codes(xq, xs, qw, torch.float32)
    assert calls == [] and rel_err(out, linear_fp8_codes_ref(xq, xs, qw, torch.float32)) < 1e-2


def test_a_tiny_fp8_decode_step_runs_every_codes_gemm_through_it(kernels_on, monkeypatch):
    """The fused decode step (tiny-fp8: every weight of whole 128 x 128 blocks) with the switch on: no
    codes GEMM left to our kernel, and the greedy frames those of the FP8 path."""
    from ttsfleet.inference.loader import load_model
    from ttsfleet.inference.sampling import SamplingBatch, SamplingParams
    from ttsfleet.kernels import triton_gemm

    def frames(choice: str) -> list[list[int]]:
        decode.set_decode_gemm(choice)
        model = load_model("tiny-fp8", device="cuda" if CUDA else "cpu", dtype=torch.float32,
                           quantize="bsgemm_fp8", config_overrides={"num_codebooks": 4})
        prompt = torch.randint(0, 500, (5, 9), generator=torch.Generator().manual_seed(5))
        cache = model.new_cache(2, 64)
        model.prefill(cache, 1, prompt.to(model.device))
        greedy = SamplingBatch.from_params([SamplingParams(seed=3, temperature=0.0, ras=False)], model.device)
        return model.decode_step(cache, torch.tensor([1], device=model.device), greedy).tolist()

    ours: list[int] = []
    real = triton_gemm.linear_fp8_codes_triton
    monkeypatch.setattr(triton_gemm, "linear_fp8_codes_triton",
                        lambda *a, **kw: ours.append(1) or real(*a, **kw))
    want = frames("fp8")
    assert ours, "the FP8 path runs our codes GEMM"
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "deep_gemm", _stand_in(calls))
    deepgemm_fp8._module.cache_clear()
    ours.clear()
    got = frames("deepgemm")
    assert calls and not ours, f"{len(ours)} codes GEMMs left to our kernel"
    assert got == want

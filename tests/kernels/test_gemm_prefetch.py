"""The FP8 GEMM's weight prefetch into L2 before the PDL wait (``TTSFLEET_GEMM_PREFETCH``).

What each test pins down, and how it can fail:
* the switch parses ``off`` / ``auto`` / a block count and names the choices on a bad value;
* :func:`gemm_prefetch_blocks`: ``off`` is 0, a count is capped at the program's K blocks, ``auto``
  keeps the launch's prefetched bytes within half of L2 (qkv at M=1 fits whole on an H200's 50 MB, the
  gate_up half only partly), so a rule that prefetched the whole 50 MB gate_up would fail here;
* the host never asks for a prefetch where the kernel cannot issue one (the interpreter, no PDL);
* on a GPU (skipped without CUDA): the result with the prefetch is bit-identical to without, for a
  plain, a split-K and a SwiGLU launch (a prefetch is a hint; if it changed a number it would be a bug).
The compiled form (instructions before the wait, one per weight half) is checked in
``test_compile_check.py``.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from ttsfleet.kernels import decode

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

H200_L2 = 50 * 1024 * 1024  # an H200's L2 by NVIDIA's spec; the launch reads the device's own figure


@pytest.fixture
def prefetch_switch():  # noqa: ANN201
    yield decode.GEMM_PREFETCH_SWITCH
    decode.GEMM_PREFETCH_SWITCH.reset()


def test_the_switch_parses_its_choices_and_names_them_on_a_bad_value() -> None:
    parse = decode.parse_gemm_prefetch
    assert parse("") == "off" and parse(" AUTO ") == "auto" and parse("4") == 4 and parse("64") == 64
    for bad in ("0", "65", "all", "-1"):
        with pytest.raises(ValueError, match="TTSFLEET_GEMM_PREFETCH=.*expected off, auto or a count 1..64"):
            parse(bad)
    assert decode.GEMM_PREFETCH_SWITCH.default == "off"


def test_blocks_per_program_by_mode() -> None:
    blocks = decode.gemm_prefetch_blocks
    # qkv 6144 x 2560 at M=1: 96 tiles of 64 rows x split 2 = 192 programs, 10 K blocks each of 64 x 128 B
    assert blocks("off", 10, 192, 64 * 128, H200_L2) == 0
    assert blocks(4, 10, 192, 64 * 128, H200_L2) == 4
    assert blocks(64, 10, 192, 64 * 128, H200_L2) == 10  # capped at the program's blocks
    assert blocks("auto", 10, 192, 64 * 128, H200_L2) == 10  # 15.7 MB: whole, within 25 MB
    # gate_up 2 x 9728 x 2560: 76 tiles of 128 (gate + up) x split 3, 7 blocks of 2 x 128 x 128 B
    gate_up = blocks("auto", 7, 228, 2 * 128 * 128, H200_L2)
    assert 0 < gate_up < 7 and gate_up * 228 * 2 * 128 * 128 <= H200_L2 // 2
    assert blocks("auto", 7, 228, 2 * 128 * 128, 1024) == 0  # an L2 smaller than one block step


def test_no_prefetch_is_asked_where_the_kernel_cannot_issue_one(prefetch_switch, monkeypatch) -> None:  # noqa: ANN001
    from ttsfleet.kernels import triton_gemm as tg
    from ttsfleet.kernels.ops import quantize_weight

    qw = quantize_weight(torch.randn(256, 256), "bsgemm_fp8")
    prefetch_switch.set("auto")
    monkeypatch.setattr(tg, "PDL", False)
    assert tg._prefetch_blocks(torch.device("cuda", 0), qw, 2, 8, 64 * 128) == 0  # no PDL: no wait
    monkeypatch.setattr(tg, "PDL", True)
    assert tg._prefetch_blocks(torch.device("cpu"), qw, 2, 8, 64 * 128) == 0  # the interpreter
    prefetch_switch.set("off")
    assert tg._prefetch_blocks(torch.device("cuda", 0), qw, 2, 8, 64 * 128) == 0
    # where it can (PDL on a CUDA device, aligned rows), the switch's blocks with the device's L2
    monkeypatch.setattr(tg, "_l2_bytes", lambda index: H200_L2)
    prefetch_switch.set("auto")
    assert tg._prefetch_blocks(torch.device("cuda", 0), qw, 2, 8, 64 * 128) == 2
    prefetch_switch.set("1")
    assert tg._prefetch_blocks(torch.device("cuda", 0), qw, 2, 8, 64 * 128) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the prefetch is PTX)")
@pytest.mark.parametrize("kind", ["linear", "split", "swiglu"])
def test_results_with_the_prefetch_equal_those_without(kind: str, prefetch_switch) -> None:  # noqa: ANN001
    from ttsfleet.kernels import triton_gemm as tg
    from ttsfleet.kernels.ops import quantize_weight
    from ttsfleet.kernels.triton_quant import quantize_activation_triton

    torch.manual_seed(0)
    n, k, m = (2 * 1024, 1024, 4) if kind == "swiglu" else (1536, 2048, 8)
    qw = quantize_weight(torch.randn(n, k, device="cuda") * 0.05, "bsgemm_fp8")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    xq, xs = quantize_activation_triton(x, 128)
    cfg = tg.GemmConfig(bn=128 if kind == "swiglu" else 64, split_k=1 if kind == "linear" else 4, tma=True)

    def run(mode: str) -> tuple[torch.Tensor, ...]:
        prefetch_switch.set(mode)
        if kind == "swiglu":
            out = torch.empty(m, n // 2, device="cuda", dtype=torch.float8_e4m3fn)
            hs = torch.empty(m, n // 2 // 128, device="cuda", dtype=torch.float32)
            tg.launch_gemm(xq, xs, qw, out, None, cfg, epi=1, h_scale=hs)
            return out.view(torch.uint8).clone(), hs.clone()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        tg.launch_gemm(xq, xs, qw, out, None, cfg)
        return (out.clone(),)

    base, with_prefetch = run("off"), run("auto")
    for a, b in zip(base, with_prefetch, strict=True):
        assert torch.equal(a, b)
    torch.cuda.synchronize()

"""The decode kernels' prefetch into L2 before the PDL wait: the FP8 GEMM's weight rows
(``TTSFLEET_GEMM_PREFETCH``) and decode attention's K/V rows (``TTSFLEET_ATTN_PREFETCH``).

What each test pins down, and how it can fail:
* both switches parse ``off`` / ``auto`` / a block count and name their variable and the choices on a
  bad value;
* :func:`prefetch_blocks`: ``off`` is 0, a count is capped at the program's K blocks, ``auto``
  keeps the launch's prefetched bytes within half of L2 (qkv at M=1 fits whole on an H200's 50 MB, the
  gate_up half only partly), so a rule that prefetched the whole 50 MB gate_up would fail here;
* the host never asks for a prefetch where the kernel cannot issue one (the interpreter, no PDL);
* attention: blocks per program from the cache's length (not the rows' lengths: a graph keeps it),
  K and V together within half of L2, a power of two;
* on a GPU (skipped without CUDA): the result with the prefetch is bit-identical to without, for a
  plain, a split-K and a SwiGLU GEMM launch and for one-pass and split attention (a prefetch is a
  hint; if it changed a number it would be a bug).
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


@pytest.mark.parametrize(("switch", "default"),
                         [(decode.GEMM_PREFETCH_SWITCH, 2), (decode.ATTN_PREFETCH_SWITCH, "off")])
def test_the_switches_parse_their_choices_and_name_them_on_a_bad_value(switch, default) -> None:  # noqa: ANN001
    """The GEMMs prefetch 2 blocks by default (timed: the decode step 0.96-1.00x of off on an H100,
    0.98-1.00x on an H200), the attention nothing; a blank value is the default."""
    parse = switch.parse
    assert parse("") == default and parse(" AUTO ") == "auto" and parse("OFF") == "off"
    assert parse("4") == 4 and parse("64") == 64
    for bad in ("0", "65", "all", "-1"):
        with pytest.raises(ValueError, match=f"^{switch.env}='.*': expected off, auto or a count 1..64$"):
            parse(bad)
    assert switch.parse(switch.default) == default


def test_attention_blocks_come_from_the_cache_length_within_half_of_l2() -> None:
    from ttsfleet.kernels.triton_attention import kv_prefetch_blocks

    # S2 Pro slow layers at 576 positions, bf16 keys of 256 B, 64-key blocks: batch 64 (512 programs,
    # 9 blocks each: 16.8 MB per block step) prefetches 1 block; batch 1 split 16 (128 programs, one
    # block per share) its whole share
    assert kv_prefetch_blocks("auto", 576, 1, 512, 256, H200_L2) == 1
    assert kv_prefetch_blocks("auto", 576, 16, 128, 256, H200_L2) == 1
    assert kv_prefetch_blocks("auto", 4096, 1, 64, 256, H200_L2) == 8  # 2 MB a step: 12 fit, 8
    assert kv_prefetch_blocks(3, 4096, 1, 64, 256, H200_L2) == 2  # a power of two
    assert kv_prefetch_blocks("off", 4096, 1, 64, 256, H200_L2) == 0
    assert kv_prefetch_blocks("auto", 4096, 1, 4096, 256, 1 << 20) == 0


def test_attention_asks_for_no_prefetch_off_the_gpu(prefetch_switch) -> None:  # noqa: ANN001
    from ttsfleet.kernels.triton_attention import kv_prefetch_args

    decode.ATTN_PREFETCH_SWITCH.set("auto")
    try:
        cache = torch.zeros(2, 64, 8, 128, dtype=torch.bfloat16)
        assert kv_prefetch_args(cache, cache.clone(), 16, 1) == {}
    finally:
        decode.ATTN_PREFETCH_SWITCH.reset()


def test_blocks_per_program_by_mode() -> None:
    blocks = decode.prefetch_blocks
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
    monkeypatch.setattr(decode, "l2_bytes", lambda index: H200_L2)
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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (the prefetch is PTX)")
@pytest.mark.parametrize("splits", [1, 4])
def test_attention_with_the_prefetch_equals_without(splits: int) -> None:
    from ttsfleet.kernels.triton_attention import decode_attention_triton, kv_prefetch_args
    from ttsfleet.kernels.triton_attention_split import decode_attention_split

    gen = torch.Generator().manual_seed(1)
    kc = torch.randn(6, 600, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    vc = torch.randn(6, 600, 8, 128, generator=gen).to("cuda", torch.bfloat16)
    q = torch.randn(3, 32, 128, generator=gen).to("cuda", torch.bfloat16)
    slots = torch.tensor([4, 0, 5], device="cuda")
    lengths = torch.tensor([600, 1, 333], device="cuda")

    def run(mode: str) -> torch.Tensor:
        decode.ATTN_PREFETCH_SWITCH.set(mode)
        if splits == 1:
            return decode_attention_triton(q, kc, vc, slots, lengths).clone()
        return decode_attention_split(q, kc, vc, slots, lengths, splits).clone()

    try:
        base, fetched = run("off"), run("auto")
        assert kv_prefetch_args(kc, vc, 3 * 8 * splits, splits)["PREFETCH"] >= 1  # it did ask
    finally:
        decode.ATTN_PREFETCH_SWITCH.reset()
    assert torch.equal(base, fetched)

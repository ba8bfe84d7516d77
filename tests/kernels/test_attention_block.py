"""The fast model's attention half in one launch (``TTSFLEET_FAST_ATTN_LAUNCH=one``;
``kernels/triton_attention_block.py``).

Its claim: QKV GEMM, RoPE + K/V store, attention over the frame cache and O GEMM as work items of one
persistent launch give the values of the separate launches with the same tiles and splits, bit for
bit (the same tile code and the one-pass attention's own program body), write the same cache, and
leave the work counters at zero. Runs in Triton's interpreter on CPU (programs one after another) and
compiled on a GPU (programs at once: the waits are real there).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.inference.model_layers import rope_table  # noqa: E402
from ttsfleet.kernels.ops import quantize_weight  # noqa: E402
from ttsfleet.kernels.reference import quantize_activation_ref  # noqa: E402
from ttsfleet.kernels.testing import graph_replays_equal, randn  # noqa: E402
from ttsfleet.kernels.workspaces import workspace  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16


pytestmark = pytest.mark.usefixtures("kernels_on")  # the interpreter on CPU, compiled on a GPU


def _tb():  # noqa: ANN202
    from ttsfleet.kernels import triton_attention_block

    return triton_attention_block


def test_the_s2_pro_fast_plan() -> None:
    """At M=1 on 132 SMs: 96 QKV tiles (half the SMs at most), 8 (row, KV head) items, 40 O tiles in
    the programs left; rows past one tile are refused."""
    plan = _tb().block_plan(1, 2560, 6144, 4096, 8, 128, 132)
    assert (plan.qkv_tiles, plan.qkv_split, plan.att_items, plan.o_tiles, plan.o_split) == (96, 1, 8, 40, 1)
    assert plan.programs == 132 and plan.items == 144
    wide = _tb().block_plan(64, 2560, 6144, 4096, 8, 128, 132)
    assert wide.att_items == 512 and wide.bm == 64 and wide.programs == 132
    assert _tb().block_plan(65, 2560, 6144, 4096, 8, 128, 132) is None
    two_per_sm = _tb().block_plan(1, 2560, 6144, 4096, 8, 128, 132, per_sm=2)  # O shares fill 264 slots
    assert (two_per_sm.o_split, two_per_sm.items, two_per_sm.programs) == (4, 264, 264)


def _separate(xq, xs, wqkv, wo, fa, plan, scheme: str) -> torch.Tensor:  # noqa: ANN001
    """QKV GEMM, RoPE + store inside attention, O GEMM: three launches with the plan's tiles."""
    from ttsfleet.kernels import triton_gemm as tg
    from ttsfleet.kernels.triton_attention import FusedRope, decode_attention_triton

    common = dict(swap=True, num_warps=plan.num_warps, num_stages=3, tma=True)
    m = xq.shape[0]
    qkv = torch.empty(m, wqkv.shape[0], device=DEV, dtype=DTYPE)
    tg.launch_gemm(xq, xs, wqkv, qkv, None, tg.GemmConfig(bn=plan.qkv_bn, split_k=plan.qkv_split, **common))
    group = tg.act_group(scheme)
    rope = FusedRope(qkv, fa.n_head, fa.head_dim, fa.rope, fa.pos, fa.q_norm, fa.k_norm, fa.eps)
    codes, scales = decode_attention_triton(rope, fa.k_cache, fa.v_cache, None, fa.lengths, quant_group=group)
    out = torch.empty(m, wo.shape[0], device=DEV, dtype=DTYPE)
    tg.launch_gemm(codes.view(m, -1), scales, wo, out, None,
                   tg.GemmConfig(bn=plan.o_bn, split_k=plan.o_split, **common))
    return out


@pytest.mark.parametrize("scheme,qk_norm", [("bsgemm_fp8", False), ("mxfp8", True), ("bsgemm_fp8", True)])
@pytest.mark.parametrize("qkv_split,o_split,programs,o_bn", [(1, 1, 4, 64), (2, 3, 7, 64), (1, 2, 200, 128)])
def test_one_launch_equals_the_separate_launches(scheme: str, qk_norm: bool, qkv_split: int, o_split: int,
                                                 programs: int, o_bn: int, gen: torch.Generator) -> None:
    """Bit for bit (output and the cache's new K/V), with split and unsplit QKV / O, O tiles of 64 and
    128 columns, fewer programs than items and more; the counters and tickets zero afterwards."""
    from ttsfleet.kernels import triton_gemm as tg

    tb = _tb()
    d, heads, kv, hd, positions, m, pos = 256, 4, 2, 128, 4, 3, 2
    group = tg.act_group(scheme)
    wqkv = quantize_weight(randn(gen, (heads + 2 * kv) * hd, d, scale=d ** -0.5, device=DEV), scheme)
    wo = quantize_weight(randn(gen, d, heads * hd, scale=(heads * hd) ** -0.5, device=DEV), scheme)
    xq, xs = quantize_activation_ref(randn(gen, m, d, dtype=DTYPE), group)
    xq, xs = xq.to(DEV), xs.to(DEV)
    cache = [randn(gen, m, positions, kv, hd, device=DEV, dtype=DTYPE) for _ in range(2)]
    norms = [(randn(gen, hd) * 0.1 + 1).to(DEV, DTYPE) if qk_norm else None for _ in range(2)]
    base = tb.block_plan(m, d, wqkv.shape[0], heads * hd, kv, group, programs, o_bn=o_bn)
    plan = tb.BlockPlan(**{**base.__dict__, "qkv_split": qkv_split, "o_split": o_split, "programs": programs})
    results = []
    for run in (lambda fa: tb.attention_block_one_launch(xq, xs, wqkv, wo, fa, DTYPE, plan=plan),
                lambda fa: _separate(xq, xs, wqkv, wo, fa, plan, scheme)):
        k_cache, v_cache = cache[0].clone(), cache[1].clone()
        rope, at = rope_table(16, hd, 10000.0).to(DEV), torch.tensor([pos], device=DEV)
        fa = tb.FrameAttention(heads, hd, rope, at, k_cache, v_cache, at + 1, *norms)
        results.append((run(fa), k_cache, v_cache))
    (got, got_k, got_v), (want, want_k, want_v) = results
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
    assert not torch.equal(got_k, cache[0]), "the row's K head at pos was not stored"
    _, tickets = workspace(xq.device, 1, 1)
    assert int(tickets.abs().sum()) == 0, "a ticket or work counter was left set"


def test_a_cache_it_cannot_take_is_refused(gen: torch.Generator) -> None:
    tb = _tb()
    wqkv = quantize_weight(randn(gen, 8 * 128, 256, device=DEV), "bsgemm_fp8")
    wo = quantize_weight(randn(gen, 256, 512, device=DEV), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, 3, 256, dtype=DTYPE), 128)
    small = torch.zeros(2, 4, 2, 128, device=DEV, dtype=DTYPE)  # 2 cache rows for 3 rows
    fa = tb.FrameAttention(4, 128, rope_table(16, 128, 10000.0).to(DEV), torch.tensor([1], device=DEV), small,
                           small.clone(), torch.tensor([2], device=DEV))
    with pytest.raises(ValueError, match="dense frame cache of >= M rows"):
        tb.attention_block_one_launch(xq.to(DEV), xs.to(DEV), wqkv, wo, fa, DTYPE)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (graph capture)")
def test_a_cuda_graph_of_it_replays_the_eager_result(gen: torch.Generator) -> None:
    """S2 Pro's fast shape at M=4: three replays of a graph holding two launches give the eager bits
    (the counters return to zero; a counter left set would skip items or spin: the timeout catches it)."""
    tb = _tb()
    d, heads, kv, hd = 2560, 32, 8, 128
    wqkv = quantize_weight(randn(gen, (heads + 2 * kv) * hd, d, scale=d ** -0.5, device=DEV), "bsgemm_fp8")
    wo = quantize_weight(randn(gen, d, heads * hd, scale=(heads * hd) ** -0.5, device=DEV), "bsgemm_fp8")
    xq, xs = quantize_activation_ref(randn(gen, 4, d, dtype=DTYPE), 128)
    xq, xs = xq.to(DEV), xs.to(DEV)
    cache = [randn(gen, 4, 10, kv, hd, device=DEV, dtype=DTYPE) for _ in range(2)]
    at = torch.tensor([5], device=DEV)
    fa = tb.FrameAttention(heads, hd, rope_table(11, hd, 1e6).to(DEV), at, *cache, at + 1)
    assert graph_replays_equal(lambda: tb.attention_block_one_launch(xq, xs, wqkv, wo, fa, DTYPE))

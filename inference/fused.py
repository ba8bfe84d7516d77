"""The fused decode path: one audio frame in ~8 launches per layer instead of ~100.

Why a second path beside the reference one in :mod:`ttsfleet.inference.model`: the reference path is
the readable statement of the numerics (and what CPU runs); this one does the same arithmetic with
the kernels of :mod:`ttsfleet.kernels` (``decode``: norm, RoPE + KV store, decode attention, sampler;
``ops``: FP8 GEMMs) and is what a CUDA graph of ``decode_step`` captures. Per block with FP8 weights:
RMSNorm (fused with the previous residual add, emitting the QKV GEMM's FP8 codes) → QKV GEMM → q/k
norm + RoPE + KV store → decode attention (emitting the O GEMM's FP8 codes) → O GEMM → residual add
+ RMSNorm (emitting FP8 codes) → SwiGLU MLP (two GEMMs). The activation quantizer never runs as a
launch of its own; its codes are bit-identical to quantizing the bf16 tensors the reference passes.
The fast model's 10-position frame uses the same blocks over a frame-local cache. With
``TTSFLEET_ROPE_ATTENTION=fused`` (:func:`ttsfleet.kernels.decode.rope_attention`) the q/k norm + RoPE
+ KV store happen inside decode attention's launch: one launch per block fewer, the same values. With
``TTSFLEET_FAST_ATTN_LAUNCH=one`` the fast model's QKV GEMM, RoPE + store, attention and O GEMM are
one launch (:func:`one_launch_attention`), likewise the same values.

When it runs: where :func:`ttsfleet.kernels.dispatch.use_triton` says so for the device (the GPU
catalog's class; ``TTSFLEET_KERNELS`` = auto | reference | interpret, read once). Sampling takes the
fused kernel only when every row's ``top_k`` is within :data:`ttsfleet.kernels.decode.TOPK_CAP`
(``SamplingBatch.fusable``); otherwise the reference sampler runs on the fused path's logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor
from ttsfleet.kernels import decode as kd
from ttsfleet.kernels import dispatch
from ttsfleet.kernels.ops import linear_fp8_codes, linear_w8a16, swiglu_mlp_fp8_codes, swiglu_w8a16

from .sampling import SamplingBatch, sample, sample_main

if TYPE_CHECKING:
    from .model import DualARModel, KVCache
    from .model_layers import Attention, Block, FeedForward, Linear


def fused_enabled(t: Tensor) -> bool:
    """Whether decode on ``t``'s device takes the fused kernels (the dispatch module decides)."""
    return dispatch.use_triton(t)


def _sample(logits: Tensor, batch: SamplingBatch, step: Tensor, draw: int, window: Tensor | None) -> Tensor:
    if batch.fusable:
        return kd.sample_topk(logits, batch, step, draw, window)
    return sample(logits, batch, step, draw, window)


def sample_main_fused(logits: Tensor, batch: SamplingBatch, step: Tensor, window: Tensor | None,
                      end_index: int) -> Tensor:
    """:func:`~ttsfleet.inference.sampling.sample_main` in one launch when fusable (two + one
    ``topk`` with ``TTSFLEET_TOPK_SELECT=torch``: :func:`ttsfleet.kernels.decode.topk_select`)."""
    if batch.fusable:
        return kd.sample_topk(logits, batch, step, 0, window, ras_end_index=end_index)
    return sample_main(logits, batch, step, window, end_index)


# ----------------------------------------------------------------------------- FP8 activations
#: An activation as the next GEMM wants it: bf16 ``Tensor`` or ``(fp8 codes, group scales)``.
Act = Any


def _a16_rows(qweight: Any, rows: int) -> bool:
    """Whether the GEMM of ``qweight`` over ``rows`` rows is the W8A16 decode GEMM's
    (``TTSFLEET_DECODE_GEMM=a16``, FP8 weights, decode size): prefill pieces keep the FP8 path, whose
    large GEMMs are cuBLAS's, and their norms keep emitting its codes."""
    return qweight is not None and kd.decode_gemm() == "a16" and rows <= kd.DECODE_GEMM_MAX_ROWS


def _group(qweight: Any, rows: int) -> int:
    """The activation group the GEMM of ``qweight`` over ``rows`` rows reads (0: a dense layer, or the
    W8A16 decode GEMM, takes bf16)."""
    if qweight is None or _a16_rows(qweight, rows):
        return 0
    from ttsfleet.kernels.reference import act_block

    return act_block(qweight.scheme)


def _w8a16(qweight: Any, a: Act) -> bool:
    """Whether this linear runs the W8A16 decode GEMM (its activation bf16, not FP8 codes)."""
    return not isinstance(a, tuple) and _a16_rows(qweight, a.shape[0])


def _linear(lin: Linear, a: Act, out_dtype: torch.dtype) -> Tensor:
    if isinstance(a, tuple):
        return linear_fp8_codes(a[0], a[1], lin.qweight, out_dtype, lin.bias)
    if _w8a16(lin.qweight, a):
        return linear_w8a16(a, lin.qweight, lin.bias).to(out_dtype)
    return lin(a)


def _mlp(ffn: FeedForward, f: Act, out_dtype: torch.dtype) -> Tensor:
    if isinstance(f, tuple):
        return swiglu_mlp_fp8_codes(f[0], f[1], ffn.gate_up_q, ffn.down_q, out_dtype)
    if _w8a16(ffn.gate_up_q, f):
        return linear_w8a16(swiglu_w8a16(f, ffn.gate_up_q), ffn.down_q).to(out_dtype)
    return ffn(f)


#: ``attend(q [rows, H, D], k_cache, v_cache, k_scale, v_scale) -> [rows, H, D]``: scores over one
#: layer's cache (the scales: an FP8 cache's exponents, else None).
Attend = Callable[[Tensor, Tensor, Tensor, "Tensor | None", "Tensor | None"], Tensor]


class DecodeAttend:
    """Each row attends to its own slot's first ``lengths[row]`` keys (one decode position per row).

    An :data:`Attend`; :meth:`quantized` also emits the O GEMM's FP8 codes (other attends, e.g. a
    prefill's causal one, return bf16 and the GEMM quantizes it)."""

    def __init__(self, slots: Tensor | None, lengths: Tensor) -> None:
        self.slots, self.lengths = slots, lengths

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, ks: Tensor | None = None,
                 vs: Tensor | None = None) -> Tensor:
        return kd.decode_attention(q, k, v, self.slots, self.lengths, 0, ks, vs)

    def quantized(self, q: Tensor, k: Tensor, v: Tensor, group: int, ks: Tensor | None = None,
                  vs: Tensor | None = None) -> Act:
        return kd.decode_attention(q, k, v, self.slots, self.lengths, group, ks, vs)


def decode_attend(slots: Tensor | None, lengths: Tensor) -> DecodeAttend:
    return DecodeAttend(slots, lengths)


def layer_kv(k: Tensor, v: Tensor, k_scale: Tensor | None, v_scale: Tensor | None, i: int) -> tuple:
    """Layer ``i``'s ``(k_cache, v_cache, k_scale, v_scale)`` (scales None: a dense cache)."""
    return k[i], v[i], None if k_scale is None else k_scale[i], None if v_scale is None else v_scale[i]


def enter_block(blk: Block, x: Tensor, branch: Tensor | None, rope: Tensor, pos: Tensor, kv: tuple,
                slots: Tensor | None) -> tuple[Tensor, Tensor]:
    """The block's first half up to attention: residual add (``branch``: the previous block's MLP
    output, None for the first) + RMSNorm, QKV GEMM, q/k norm + RoPE + K/V store -> ``(q [rows, H,
    D], the residual stream)``. Everything here is per row: a CUDA graph of it may run padded rows."""
    att = blk.attention
    qkv, x = _qkv(blk, x, branch)
    k_cache, v_cache, ks, vs = kv
    q = kd.qkv_rope_store(qkv, att.n_head, att.n_kv, att.head_dim, rope, pos, k_cache, v_cache, slots,
                          *_qk_norms(att), eps=_qk_eps(att), k_scale=ks, v_scale=vs)
    return q, x


def _qkv(blk: Block, x: Tensor, branch: Tensor | None) -> tuple[Tensor, Tensor]:
    """Residual add + RMSNorm (emitting the QKV GEMM's codes) and the QKV GEMM: ``(qkv, the residual
    stream)``."""
    att = blk.attention
    a, x = kd.rmsnorm(x, blk.attention_norm.weight, blk.attention_norm.eps, branch,
                      _group(att.wqkv.qweight, x.shape[0]))
    return _linear(att.wqkv, a, x.dtype), x


def _qk_norms(att: Attention) -> tuple[Tensor | None, Tensor | None]:
    return (att.q_norm.weight, att.k_norm.weight) if att.qk_norm else (None, None)


def _qk_eps(att: Attention) -> float:
    return att.q_norm.eps if att.qk_norm else 1e-6


def _o_codes_group(att: Attention, t: Tensor) -> int:
    """The activation group in which decode attention can hand the O GEMM FP8 codes (0: bf16 out)."""
    group = _group(att.wo.qweight, t.shape[0])
    return group if group and not att.head_dim % group and dispatch.use_triton(t) else 0


def enter_attend_block(blk: Block, x: Tensor, branch: Tensor | None, rope: Tensor, pos: Tensor, kv: tuple,
                       attend: DecodeAttend) -> tuple[Act, Tensor]:
    """:func:`enter_block` then :func:`attend_block` with the RoPE + KV store inside decode attention's
    launch (:func:`ttsfleet.kernels.decode.rope_attention`): ``(attention output as the O GEMM reads
    it, the residual stream)``, the same values as the two."""
    att = blk.attention
    qkv, x = _qkv(blk, x, branch)
    quant = _o_codes_group(att, qkv)
    k_cache, v_cache, ks, vs = kv
    y = kd.rope_attention(qkv, att.n_head, att.head_dim, rope, pos, k_cache, v_cache, attend.slots,
                          attend.lengths, *_qk_norms(att), eps=_qk_eps(att), quant_group=quant,
                          k_scale=ks, v_scale=vs)
    return (y if quant else y.reshape(y.shape[0], -1)), x


def attend_block(blk: Block, q: Tensor, kv: tuple, attend: Attend) -> Act:
    """Attention of ``q`` over the layer's cache, as the O GEMM reads it: FP8 codes where a decode
    attend can emit them, else bf16 ``[rows, H * D]`` (the GEMM quantizes it). Rows meet here."""
    group = _o_codes_group(blk.attention, q)
    if group and isinstance(attend, DecodeAttend):
        return attend.quantized(q, *kv[:2], group, *kv[2:])
    y = attend(q, *kv)
    return y.reshape(y.shape[0], -1)


def leave_block(blk: Block, y: Act, x: Tensor) -> tuple[Tensor, Tensor]:
    """The block's second half after attention: O GEMM, residual add + RMSNorm, SwiGLU MLP ->
    ``(the MLP output, which the next norm adds, the residual stream)``. Per row, like
    :func:`enter_block`."""
    return ffn_half(blk, _linear(blk.attention.wo, y, x.dtype), x)


def ffn_half(blk: Block, o: Tensor, x: Tensor) -> tuple[Tensor, Tensor]:
    """Residual add of the O projection ``o`` + RMSNorm, SwiGLU MLP -> ``(the MLP output, the
    residual stream)``."""
    group = _group(blk.feed_forward.gate_up_q, x.shape[0])
    f, x = kd.rmsnorm(x, blk.ffn_norm.weight, blk.ffn_norm.eps, o, group)
    return _mlp(blk.feed_forward, f, x.dtype), x


def one_launch_attention(blk: Block, x: Tensor, branch: Tensor | None, rope: Tensor, pos: Tensor, kv: tuple,
                         attend: Attend) -> tuple[Tensor, Tensor] | None:
    """The block's attention half (residual add + RMSNorm, then QKV GEMM, RoPE + K/V store, attention
    and O GEMM in one launch: :func:`ttsfleet.kernels.decode.frame_attention_block`) -> ``(the O
    projection, the residual stream)``, where ``TTSFLEET_FAST_ATTN_LAUNCH=one`` and it applies: a
    frame-local dense cache (rows are slots, one shared position: the fast model), FP8 weights in one
    activation group without biases (heads narrower than a group: the attention hands the O GEMM its
    output in the stream's dtype, which the GEMM quantizes, as the separate launches do), at most 64
    rows, on the Triton kernels where their attention fits. None elsewhere."""
    if kd.fast_attn_launch() != "one" or not isinstance(attend, DecodeAttend) or attend.slots is not None:
        return None
    from ttsfleet.kernels.triton_attention_block import MAX_ROWS, FrameAttention

    att = blk.attention
    k_cache, v_cache, ks, _ = kv
    group = _group(att.wqkv.qweight, x.shape[0])
    if not (ks is None and group and group == _group(att.wo.qweight, x.shape[0])
            and att.wqkv.bias is None and att.wo.bias is None and x.shape[0] <= MAX_ROWS
            and pos.numel() == 1 and attend.lengths.numel() == 1 and k_cache.dtype == x.dtype
            and dispatch.use_triton(x)
            and kd.attention_kernel_fits(x.new_empty(0, att.n_head, att.head_dim), k_cache, v_cache)):
        return None
    a, x = kd.rmsnorm(x, blk.attention_norm.weight, blk.attention_norm.eps, branch, group)
    fa = FrameAttention(att.n_head, att.head_dim, rope, pos, k_cache, v_cache, attend.lengths,
                        *_qk_norms(att), eps=_qk_eps(att))
    return kd.frame_attention_block(a[0], a[1], att.wqkv.qweight, att.wo.qweight, fa, x.dtype), x


def run_blocks(blocks: list[Block], x: Tensor, rope: Tensor, pos: Tensor, k: Tensor, v: Tensor,
               slots: Tensor | None, attend: Attend, final_norm: torch.nn.Module,
               k_scale: Tensor | None = None, v_scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Rows ``x [rows, dim]`` through ``blocks`` -> (pre-norm hidden, ``final_norm`` of it).

    Row r sits at position ``pos[r]`` of cache slot ``slots[r]`` (``pos`` may be one shared value,
    ``slots`` None = slot r). ``k``/``v``: ``[n_layer, slots, S, KV, D]`` caches (FP8 codes with
    ``k_scale``/``v_scale`` exponents, or dense). Each layer's residual add is fused into the next
    RMSNorm, so the stream is read and written once per norm; with FP8 weights each norm emits the
    codes its GEMM reads.
    """
    branch = None
    rope_inside = (isinstance(attend, DecodeAttend) and attend.slots is slots
                   and kd.rope_attention_mode() == "fused")
    for i, blk in enumerate(blocks):
        kv = layer_kv(k, v, k_scale, v_scale, i)
        if (one := one_launch_attention(blk, x, branch, rope, pos, kv, attend)) is not None:
            branch, x = ffn_half(blk, *one)
            continue
        if rope_inside:
            y, x = enter_attend_block(blk, x, branch, rope, pos, kv, attend)
        else:
            q, x = enter_block(blk, x, branch, rope, pos, kv, slots)
            y = attend_block(blk, q, kv, attend)
        branch, x = leave_block(blk, y, x)
    normed, x = kd.rmsnorm(x, final_norm.weight, final_norm.eps, branch)
    return x, normed


def slow_step(model: DualARModel, cache: KVCache, slots: Tensor, frame: Tensor) -> None:
    """Fused :meth:`DualARModel._slow_step`: append ``frame [bs, 1 + ncb]`` to each slot."""
    pos = cache.lengths[slots].clamp(max=cache.max_seq_len - 1)
    x = model.embed(frame[:, :, None])[:, 0]
    h, normed = run_blocks(list(model.layers), x, model.rope, pos, cache.k, cache.v, slots,
                           decode_attend(slots, pos + 1), model.norm, cache.k_scale, cache.v_scale)
    cache.pending_logits[slots] = model.main_logits(normed)
    cache.pending_hidden[slots] = model.fast_input(h, normed)
    cache.lengths[slots] = pos + 1


def prefill(model: DualARModel, cache: KVCache, slot: int, tokens: Tensor,
            start: int) -> tuple[Tensor, Tensor]:
    """Fused body of :meth:`DualARModel.prefill`: ``tokens [1, 1 + ncb, T]`` at positions ``start ..``.

    Writes the K/V of every position into ``slot`` and returns the last position's (pre-norm hidden,
    normed hidden). ~16 launches per layer instead of ~100: a prefill call was host-bound (~60 ms at
    S2 Pro size whatever its length up to 512 tokens), not GEMM-bound.
    """
    from ttsfleet.kernels.reference import dequantize_kv

    from .model_layers import attend

    t = int(tokens.shape[-1])
    end = start + t
    dev = tokens.device
    pos = torch.arange(start, end, device=dev)
    slots = torch.full((t,), slot, device=dev, dtype=torch.int64)
    mask = None
    if start:  # query i (position start+i) sees keys 0 .. start+i
        mask = (torch.arange(end, device=dev)[None, :] <= pos[:, None])[None, None]

    def causal(q: Tensor, k: Tensor, v: Tensor, ks: Tensor | None = None, vs: Tensor | None = None) -> Tensor:
        k, v = k[slot, None, :end], v[slot, None, :end]
        if ks is not None and vs is not None:  # an FP8 cache, read dequantized
            k = dequantize_kv(k, ks[slot, None, :end], q.dtype)
            v = dequantize_kv(v, vs[slot, None, :end], q.dtype)
        y = attend(q[None], k, v, mask, causal=mask is None)
        return y[0].view(t, *q.shape[1:])

    x = model.embed(tokens)[0]
    h, normed = run_blocks(list(model.layers), x, model.rope, pos, cache.k, cache.v, slots, causal,
                           model.norm, cache.k_scale, cache.v_scale)
    return h[-1:], normed[-1:]


def fast_decode(model: DualARModel, hidden: Tensor, cb0: Tensor, sampling: SamplingBatch,
                window: Tensor | None, step: Tensor) -> Tensor:
    """Fused :meth:`DualARModel._fast_decode`: the frame's codes ``[bs, ncb]`` after ``cb0``."""
    c = model.config
    bs, n = hidden.shape[0], c.num_codebooks
    shape = (c.n_fast_layer, bs, n, c.fast_n_local_heads, c.fast_head_dim)
    # zeros, not empty: every key is written before it is read, but the torch fallback of decode
    # attention masks unread positions after multiplying by them (0 * NaN from stale memory = NaN)
    fk = torch.zeros(shape, device=hidden.device, dtype=model.dtype)
    fv = torch.zeros_like(fk)
    positions = model.fast_positions  # int64 [n + 1]: 0 .. n
    layers = list(model.fast_layers)
    x = hidden.to(model.dtype)
    codes = [cb0]
    for k in range(n):
        if k:
            x = model.fast_embeddings(codes[-1])
        _, normed = run_blocks(layers, x, model.fast_rope, positions[k:k + 1], fk, fv, None,
                               decode_attend(None, positions[k + 1:k + 2]), model.fast_norm)
        if k:
            logits = model.codebook_logits(normed)
            win = None if window is None else window[:, :, k]
            codes.append(_sample(logits, sampling, step, 1 + k, win))
    return torch.stack(codes, dim=1)

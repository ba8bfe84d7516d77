"""The fused decode path: one audio frame in ~10 launches per layer instead of ~100.

Why a second path beside the reference one in :mod:`ttsfleet.inference.model`: the reference path is
the readable statement of the numerics (and what CPU runs); this one does the same arithmetic with
the kernels of :mod:`ttsfleet.inference.triton_decode`, the FP8 GEMMs and
:mod:`ttsfleet.inference.decode_attention`, and is what a CUDA graph of ``decode_step`` captures.
Per block: RMSNorm (fused with the previous residual add) → QKV GEMM → q/k norm + RoPE + KV store →
decode attention → O GEMM → residual add + RMSNorm → SwiGLU MLP (two GEMMs). The fast model's
10-position frame uses the same decode attention over a frame-local cache.

When it runs: on CUDA whenever Triton imports (``TTSFLEET_FUSED=0`` turns it off); on CPU only when
asked for (``TTSFLEET_FUSED=interpret`` with ``TRITON_INTERPRET=1``: the tests' way to check the
kernels without a GPU). Sampling takes the fused kernel only when every row's ``top_k`` is within
:data:`~ttsfleet.inference.triton_decode.TOPK_CAP` (``SamplingBatch.fusable``); otherwise the
reference sampler runs on the fused path's logits.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from .sampling import SamplingBatch, sample, sample_main

if TYPE_CHECKING:
    from .model import DualARModel, KVCache
    from .model_layers import Block


@functools.cache
def _triton_importable() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


def fused_enabled(t: Tensor) -> bool:
    """Whether decode on ``t``'s device takes the fused kernels (see the module docstring)."""
    mode = os.environ.get("TTSFLEET_FUSED", "auto")
    if mode == "0" or not _triton_importable():
        return False
    if t.is_cuda:
        return True
    return mode == "interpret" and os.environ.get("TRITON_INTERPRET") == "1"


def _kernels():  # noqa: ANN202 - the triton_decode module (imported lazily: triton is optional)
    from . import triton_decode

    return triton_decode


def _sample(logits: Tensor, batch: SamplingBatch, step: Tensor, draw: int, window: Tensor | None) -> Tensor:
    if batch.fusable:
        return _kernels().sample_topk(logits, batch, step, draw, window)
    return sample(logits, batch, step, draw, window)


def sample_main_fused(logits: Tensor, batch: SamplingBatch, step: Tensor, window: Tensor | None,
                      end_index: int) -> Tensor:
    """:func:`~ttsfleet.inference.sampling.sample_main` in two launches + one ``topk`` when fusable."""
    if batch.fusable:
        return _kernels().sample_topk(logits, batch, step, 0, window, ras_end_index=end_index)
    return sample_main(logits, batch, step, window, end_index)


#: ``attend(q [rows, H, D], k_cache, v_cache) -> [rows, H, D]``: scores over one layer's cache.
Attend = Callable[[Tensor, Tensor, Tensor], Tensor]


def decode_attend(slots: Tensor | None, lengths: Tensor) -> Attend:
    """Each row attends to its own slot's first ``lengths[row]`` keys (one decode position per row)."""
    from .decode_attention import decode_attention

    return lambda q, k, v: decode_attention(q, k, v, slots, lengths)


def _attention_half(blk: Block, a: Tensor, rope: Tensor, pos: Tensor, k_cache: Tensor, v_cache: Tensor,
                    slots: Tensor | None, attend: Attend) -> Tensor:
    """``a`` (normed) -> the attention branch output ``[rows, dim]`` (K/V of these positions stored)."""
    att = blk.attention
    qkv = att.wqkv(a)
    norms = (att.q_norm.weight, att.k_norm.weight) if att.qk_norm else (None, None)
    q = _kernels().qkv_rope_store(qkv, att.n_head, att.n_kv, att.head_dim, rope, pos, k_cache, v_cache, slots,
                                  *norms, eps=att.q_norm.eps if att.qk_norm else 1e-6)
    y = attend(q, k_cache, v_cache)
    return att.wo(y.reshape(y.shape[0], -1))


def run_blocks(blocks: list[Block], x: Tensor, rope: Tensor, pos: Tensor, k: Tensor, v: Tensor,
               slots: Tensor | None, attend: Attend, final_norm: torch.nn.Module) -> tuple[Tensor, Tensor]:
    """Rows ``x [rows, dim]`` through ``blocks`` -> (pre-norm hidden, ``final_norm`` of it).

    Row r sits at position ``pos[r]`` of cache slot ``slots[r]`` (``pos`` may be one shared value,
    ``slots`` None = slot r). ``k``/``v``: ``[n_layer, slots, S, KV, D]`` caches. Each layer's residual
    add is fused into the next RMSNorm, so the stream is read and written once per norm.
    """
    rms = _kernels().rmsnorm
    branch = None
    for i, blk in enumerate(blocks):
        a, x = rms(x, blk.attention_norm.weight, blk.attention_norm.eps, branch)
        o = _attention_half(blk, a, rope, pos, k[i], v[i], slots, attend)
        f, x = rms(x, blk.ffn_norm.weight, blk.ffn_norm.eps, o)
        branch = blk.feed_forward(f)
    normed, x = rms(x, final_norm.weight, final_norm.eps, branch)
    return x, normed


def slow_step(model: DualARModel, cache: KVCache, slots: Tensor, frame: Tensor) -> None:
    """Fused :meth:`DualARModel._slow_step`: append ``frame [bs, 1 + ncb]`` to each slot."""
    pos = cache.lengths[slots].clamp(max=cache.max_seq_len - 1)
    x = model.embed(frame[:, :, None])[:, 0]
    h, normed = run_blocks(list(model.layers), x, model.rope, pos, cache.k, cache.v, slots,
                           decode_attend(slots, pos + 1), model.norm)
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
    from .model_layers import attend

    t = int(tokens.shape[-1])
    end = start + t
    dev = tokens.device
    pos = torch.arange(start, end, device=dev)
    slots = torch.full((t,), slot, device=dev, dtype=torch.int64)
    mask = None
    if start:  # query i (position start+i) sees keys 0 .. start+i
        mask = (torch.arange(end, device=dev)[None, :] <= pos[:, None])[None, None]

    def causal(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        y = attend(q[None], k[slot, None, :end], v[slot, None, :end], mask, causal=mask is None)
        return y[0].view(t, *q.shape[1:])

    x = model.embed(tokens)[0]
    h, normed = run_blocks(list(model.layers), x, model.rope, pos, cache.k, cache.v, slots, causal,
                           model.norm)
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
            logits = F.linear(normed.float(), model.fast_head)
            win = None if window is None else window[:, :, k]
            codes.append(_sample(logits, sampling, step, 1 + k, win))
    return torch.stack(codes, dim=1)

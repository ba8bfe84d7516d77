"""Prompt heads prefilled once and reused: real-time mode's "prefill at connection open".

Why: a request in a cloned voice starts with the same head every time — the system text and the
voice references' transcripts and codes (hundreds of tokens) — and only its tail (the text to
speak) is new. The write-up's real-time endpoint prefills that head when the live connection opens,
off the latency-critical path, so the time to first audio counts only the tail's prefill. The same
head also starts every later segment of a long text (the previous segment's codes follow it).

A :class:`PrefixKV` is the head's tokens and every layer's K/V for them, copied out of the KV cache
once its prefill is done (the slot is freed at once: a held head costs memory, never a decode
slot). A request whose prompt starts with those tokens gets a fresh slot with the K/V copied back
and is prefilled from the head's end: the slot then holds what a full prefill would have written
there (the same positions, the same causal attention over them), and its tail attends to it as to
any earlier chunk of a chunked prefill. S2 Pro in bf16: 147 kB per head token (2 x 36 layers x 8
KV heads x 128 x 2 bytes), so a 400-token voice head is 59 MB of device memory while a session
holds it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .model import KVCache


@dataclass(frozen=True)
class PrefixKV:
    """A prefilled prompt head: ``tokens [1 + ncb, P]`` (host) and their K/V ``[n_layer, P, n_kv, D]``
    as the cache stores them (FP8 codes with their exponent bytes for an FP8 cache)."""

    tokens: Tensor
    k: Tensor
    v: Tensor
    k_scale: Tensor | None = None
    v_scale: Tensor | None = None

    @property
    def length(self) -> int:
        return int(self.tokens.shape[-1])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.k_scale, self.v_scale)
                   if t is not None)

    def starts(self, prompt: Tensor) -> bool:
        """Whether ``prompt [1 + ncb, T]`` begins with this head and has at least one token after it
        (the prefill of the tail computes the logits the first frame is sampled from)."""
        p = self.length
        return (prompt.dim() == 2 and prompt.shape[0] == self.tokens.shape[0] and prompt.shape[-1] > p
                and torch.equal(prompt[:, :p].to(self.tokens.dtype), self.tokens))


def snapshot_prefix(cache: KVCache, slot: int, tokens: Tensor) -> PrefixKV:
    """Copy the K/V of ``slot``'s first ``tokens.shape[-1]`` positions (prefilled) out of the cache."""
    p = int(tokens.shape[-1])
    if not 0 < p < cache.max_seq_len:
        raise ValueError(f"a prefix of {p} tokens does not fit a cache of {cache.max_seq_len} positions")

    def take(t: Tensor | None) -> Tensor | None:
        return None if t is None else t[:, slot, :p].clone()

    return PrefixKV(tokens.detach().to("cpu", torch.int64).clone(), take(cache.k), take(cache.v),
                    take(cache.k_scale), take(cache.v_scale))


def restore_prefix(cache: KVCache, slot: int, prefix: PrefixKV) -> None:
    """Write ``prefix``'s K/V into ``slot``'s first positions and set its length there: the slot is then
    ready for the prefill of the rest of the prompt from position ``prefix.length``."""
    if (prefix.k_scale is None) != (cache.k_scale is None):
        raise ValueError("a prefix snapshot of one KV dtype cannot be restored into a cache of another")
    p = prefix.length
    for dst, src in ((cache.k, prefix.k), (cache.v, prefix.v), (cache.k_scale, prefix.k_scale),
                     (cache.v_scale, prefix.v_scale)):
        if dst is not None and src is not None:
            dst[:, slot, :p].copy_(src, non_blocking=True)
    cache.lengths[slot].fill_(p)  # fill_: ``[slot] = p`` would copy from the host and sync the stream

"""The Fish Speech DualAR model (S2 Pro / S1-mini layouts) with a static, slot-based KV cache.

Why slots: the engine batches many requests that started at different times. Every request owns a
slot of a preallocated cache (static shapes → CUDA-graph capture up to ``cuda_graph_max_bs``), and
one :meth:`DualARModel.decode_step` advances any set of slots by exactly one audio frame.

One frame = sample the main token from the slot's pending slow logits (restricted to the semantic
ids + ``<|im_end|>``, see "Main-token head" below), run the fast transformer over the codebooks
(position 0 = slow hidden state, position k = embedding of code k-1; its KV resets every frame), then
one slow step on the new frame so the slot holds the next logits.

API (the engine / server build on exactly this)::

    from ttsfleet.inference.loader import load_model, load_codec, load_tokenizer
    model = load_model("tiny" | "s1-mini" | "s2-pro" | "/path/to/checkpoint_dir", device="cpu",
                       dtype=torch.float32, quantize="bf16" | "bsgemm_fp8" | "mxfp8" | "auto", seed=0)
    model.config            # DualARConfig: num_codebooks, codebook_size, semantic_begin_id,
                            # semantic_end_id, im_end_id, vocab_size, max_seq_len, ...
    cache = model.new_cache(max_slots: int, max_seq_len: int,      # static KV cache + per-slot state
                            kv_dtype="auto" | "fp8")               # "fp8": e4m3 K/V, see "FP8 KV cache"
    model.prefill(cache, slot: int, prompt: LongTensor[1 + num_codebooks, T], start: int | None = None)
        # Chunked prefill: writes K/V at positions start .. start+T-1 (start defaults to
        # cache.length(slot), i.e. 0 for a fresh or released slot; start=0 restarts the slot) and
        # attends causally to everything the slot already holds. Feeding a prompt as consecutive
        # chunks (prompt[:, :a], prompt[:, a:b], ...) leaves the slot's K/V, length and pending
        # logits/hidden as one call with the whole prompt does (up to float rounding); each chunk
        # updates the pending logits/hidden from its last position, so only the final chunk's matter.
        # start > cache.length(slot) (a hole) or start + T >= cache.max_seq_len (no room left for
        # the first decoded frame) raises ValueError; nothing is clamped.
    model.prefill_batch(cache, [PrefillPiece(slot, tokens [1 + ncb, T], start), ...])
        # Several slots' pieces in one variable-length call (the engine's per-iteration prefill):
        # each slot ends as prefill(cache, slot, tokens, start) leaves it (up to float rounding).
        # Rows of all pieces share the GEMMs; attention regroups them per slot (causal flash when
        # every piece starts at 0, else a mask over the slot's cache). An explicit start is trusted.
    frames = model.decode_step(cache, slots: LongTensor[bs], sampling: SamplingBatch,
                               window: IntTensor[bs, W, num_codebooks]) -> LongTensor[bs, 1 + num_codebooks]
        # row b = [main_token, cb0..cb{n-1}] for slots[b]; main_token == im_end_id: request finished.
        # window: int32 previous frames' codes (newest last, entries < 0 = empty), maintained by the
        # engine with ttsfleet.kernels.prev_tokens_shift_(window, frames[:, 1:].int()).
    model.release(cache, slot)
    cache.length(slot)      # tokens held by the slot; the engine must stop a request before
                            # cache.max_seq_len (decode positions past it are clamped, not raised, so
                            # that decode_step stays graph-capturable; prefill raises instead).

CUDA graphs: ``decode_step`` has static shapes for a fixed ``bs`` and never syncs with the host; capture
it with static ``slots`` / ``window`` / ``SamplingBatch`` tensors (refresh them with ``copy_``). Slow-model
decode attention reads the cache in place through ``slots`` up to each slot's length
(:func:`ttsfleet.kernels.decode.decode_attention`, Triton where the kernel dispatch says so).

Main-token head: only ``n_allowed = num_semantic + 1`` rows of the slow LM head can ever be sampled
(4,097 of S2 Pro's 155,776), so :meth:`DualARModel.finalize` copies them once into a contiguous float32
``model.main_head [n_allowed, dim]`` (rows of the untied ``output`` weight, else of the tied
embedding) and prefill / decode compute only those logits (S2 Pro: 4097 x 2560 x 4 B = 42 MB read
per slow step instead of 155776 x 2560 x 2 B = 798 MB for the whole bf16 vocab). Row order, which is
also the column order of ``cache.pending_logits`` and the index the sampler's noise is keyed by:
``i < num_semantic`` is semantic code ``i`` (token ``semantic_begin_id + i``), row ``num_semantic`` is
``<|im_end|>``. ``model.main_head_ids`` (int64 ``[n_allowed]``) maps a row back to its token id, and
``model.main_head[i] == lm_head_weight[main_head_ids[i]]`` exactly. The head stays float32 under FP8
quantization, like the fast head (bf16/FP8 logits turn near-ties into rounding coin flips).
``model.restrict_main_head = False`` switches prefill / decode to the reference path (whole-vocab
logits, then the allowed columns: the same as masking the rest to -inf) for tests; it gives the same
tokens.

FP8 KV cache (``new_cache(..., kv_dtype="fp8")``, off by default: ``auto`` keeps the model's dtype):
the slow model's K/V are stored as e4m3 codes with one power-of-two scale (a UE8M0 exponent byte) per
cache position, layer and KV head, quantized where they are stored, from the value a dense cache
would hold (:func:`ttsfleet.kernels.reference.quantize_kv_ref`; why that granularity:
:mod:`ttsfleet.kernels.decode`). Every attention reads the cache, dequantized (exactly): decode,
and prefill too, also among a chunk's own positions (the fused path's kernels only write K/V into
the cache), so a prompt fed in chunks attends exactly what a one-shot prefill does. The cache
takes (D + 1) / (2 D) of the bf16 bytes (S2 Pro, D = 128: 50.4 %). The fast model's frame-local
cache stays dense (10 positions).

Also (used by tests and tools): :meth:`DualARModel.forward_slow` (no cache, full-vocab logits + hand-off
hidden state) and :meth:`DualARModel.fast_logits` (teacher-forced fast transformer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from ttsfleet.kernels.decode import decode_attention
from ttsfleet.kernels.reference import dequantize_kv, quantize_kv_ref

from ttsfleet.quantization import BF16, QuantScheme, is_fp8, parse_scheme

from . import fused
from .fused import fused_enabled
from .model_config import DualARConfig
from .model_layers import Block, Linear, RMSNorm, attend, head_logits, rope_table
from .sampling import SamplingBatch, sample, sample_main

if TYPE_CHECKING:
    from .prefill_graphs import PrefillGraphs

#: ``kv_dtype`` of :meth:`DualARModel.new_cache`: ``auto`` (the model's dtype) or ``fp8`` (e4m3 codes
#: + one UE8M0 exponent per position and KV head).
KV_DTYPES = ("auto", "fp8")


@dataclass
class KVCache:
    """Static per-slot state. ``k``/``v``: ``[n_layer, max_slots, max_seq_len, n_kv, head_dim]`` in the
    model's dtype, or FP8 codes with ``k_scale``/``v_scale`` uint8 ``[n_layer, max_slots, max_seq_len,
    n_kv]`` exponents beside them (``kv_dtype="fp8"``)."""

    k: Tensor
    v: Tensor
    lengths: Tensor  # int64 [max_slots]: next position to write
    steps: Tensor  # int64 [max_slots]: frames decoded (sampling counter)
    pending_logits: Tensor  # float32 [max_slots, num_semantic + 1], columns = main-head rows
    pending_hidden: Tensor  # [max_slots, fast_dim]
    k_scale: Tensor | None = None
    v_scale: Tensor | None = None

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None

    @property
    def kv_nbytes(self) -> int:
        """Bytes the K/V (and their exponents) take."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v, self.k_scale, self.v_scale)
                   if t is not None)

    def layer(self, i: int) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """Layer ``i``'s ``(k, v, k_scale, v_scale)`` (scales None for a dense cache)."""
        if self.k_scale is None or self.v_scale is None:
            return self.k[i], self.v[i], None, None
        return self.k[i], self.v[i], self.k_scale[i], self.v_scale[i]

    def store(self, i: int, index: tuple, k: Tensor, v: Tensor) -> None:
        """Write K/V ``[..., n_kv, head_dim]`` at ``cache[i][index]``, quantized for an FP8 cache."""
        if self.k_scale is None or self.v_scale is None:
            self.k[i][index] = k
            self.v[i][index] = v
            return
        for codes, exps, x in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            q, e = quantize_kv_ref(x)
            codes[i][index] = q
            exps[i][index] = e

    def read(self, i: int, index: tuple, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """K/V at ``cache[i][index]`` as ``dtype`` values (an FP8 cache dequantized, exactly)."""
        k, v = self.k[i][index], self.v[i][index]
        if self.k_scale is None or self.v_scale is None:
            return k, v
        return (dequantize_kv(k, self.k_scale[i][index], dtype),
                dequantize_kv(v, self.v_scale[i][index], dtype))

    @property
    def max_slots(self) -> int:
        return int(self.k.shape[1])

    @property
    def max_seq_len(self) -> int:
        return int(self.k.shape[2])

    def length(self, slot: int) -> int:
        return int(self.lengths[slot])


@dataclass
class PrefillPiece:
    """One slot's prompt piece for :meth:`DualARModel.prefill_batch`: ``tokens [1 + ncb, T]`` at ``start``."""

    slot: int
    tokens: Tensor
    start: int | None = None


@dataclass
class _VarlenLayout:
    """Where the rows of a variable-length prefill batch sit: per row its slot and position; per piece
    its slot, end and last row; and the padded ``[pieces, max_len]`` grid attention regroups rows into."""

    pos: Tensor  # int64 [N]
    row_slots: Tensor  # int64 [N]
    slots: Tensor  # int64 [B]
    starts: Tensor  # int64 [B]
    ends: Tensor  # int64 [B]
    last: Tensor  # int64 [B]: row index of each piece's last position
    grid: Tensor  # int64 [N]: row -> index into the flattened [B, max_len] query grid
    mask: Tensor  # bool [B, 1, max_len, max_end]: query i of piece b sees keys 0 .. start_b + i
    max_len: int
    max_end: int
    fresh: bool = False  # every piece starts at position 0
    lone_slot: int | None = None  # the slot of a one-piece batch: its rows are the grid as they are

    @classmethod
    def build(cls, slots: list[int], spans: list[tuple[int, int]], device: torch.device) -> _VarlenLayout:
        """Built in numpy and moved in two copies (the index arrays in one, the mask): every torch call,
        a CPU one included, lets go of the GIL, and the engine thread that gives it up waits for it
        behind the codec and client threads. On the H200 this function was 12 % of the engine
        thread's samples at c=64 as ~20 small torch calls per prefill (2026-12-03d, py-spy)."""
        starts = np.array([s for s, _ in spans], np.int64)
        ends = np.array([e for _, e in spans], np.int64)
        lens = ends - starts
        max_len, max_end = int(lens.max()), int(ends.max())
        pos = np.concatenate([np.arange(s, e) for s, e in spans])
        row_slots = np.repeat(np.array(slots, np.int64), lens)
        grid = np.concatenate([b * max_len + np.arange(n) for b, n in enumerate(lens)])
        last = np.cumsum(lens) - 1
        seen = starts[:, None, None] + np.arange(max_len)[None, :, None]  # last key of each query
        mask = np.arange(max_end)[None, None, :] <= seen
        host = (pos, row_slots, np.array(slots, np.int64), starts, ends, last, grid)
        flat = torch.from_numpy(np.concatenate(host).astype(np.int64, copy=False))
        dev = flat.to(device, non_blocking=True).split([len(h) for h in host])  # no host sync
        return cls(*dev, mask=torch.from_numpy(mask)[:, None].to(device, non_blocking=True), max_len=max_len,
                   max_end=max_end, fresh=bool((starts == 0).all()),
                   lone_slot=slots[0] if len(slots) == 1 else None)

    def attend(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None = None,
               v_scale: Tensor | None = None) -> Tensor:
        """Rows ``q [N, H, D]`` against their slots' caches ``[slots, S, KV, D]`` -> ``[N, H, D]``.

        When every piece starts its slot (``fresh``), the padded grid is plain causal attention over
        positions ``0 .. max_len`` (a padded tail sits after every real query): the flash kernel.
        Otherwise a mask says which cached keys each query sees. An FP8 cache (``k_scale`` /
        ``v_scale``) is read dequantized. One piece (the common call) needs no regrouping: its rows
        are the grid, its slot's cache a view (no gather, ~5 fewer launches per layer)."""
        b = self.slots.shape[0]
        if self.lone_slot is not None:
            grid_q, pick = q[None], slice(self.lone_slot, self.lone_slot + 1)
        else:
            grid_q = q.new_zeros(b * self.max_len, *q.shape[1:])
            grid_q[self.grid] = q
            grid_q, pick = grid_q.view(b, self.max_len, *q.shape[1:]), self.slots

        def gather(cache: Tensor) -> Tensor:
            part = cache[:, :self.max_end]
            return part[pick] if isinstance(pick, slice) else part.index_select(0, pick)

        k, v = gather(k_cache), gather(v_cache)
        if k_scale is not None and v_scale is not None:
            k, v = dequantize_kv(k, gather(k_scale), q.dtype), dequantize_kv(v, gather(v_scale), q.dtype)
        y = attend(grid_q, k, v, None if self.fresh else self.mask, causal=self.fresh)  # [B, max_len, H*D]
        y = y.reshape(b * self.max_len, *q.shape[1:])
        return y if self.lone_slot is not None else y[self.grid]


def check_kv_dtype(kv_dtype: str) -> None:
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"kv_dtype {kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")


class DualARModel(nn.Module):
    """Slow transformer over text/semantic tokens + fast transformer over the codebooks of a frame.

    Parameter names follow the S1 flat checkpoint layout (the loader maps S2 names onto them).
    """

    def __init__(self, config: DualARConfig) -> None:
        super().__init__()
        c = self.config = config
        self.embeddings = nn.Embedding(c.vocab_size, c.dim)
        self.codebook_embeddings = nn.Embedding(c.codebook_size * c.num_codebooks, c.dim)
        self.layers = nn.ModuleList(
            Block(c.dim, c.n_head, c.n_local_heads, c.head_dim, c.intermediate_size, c.attention_qk_norm,
                  c.norm_eps) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, c.norm_eps)
        self.output = None if c.tie_word_embeddings else Linear(c.dim, c.vocab_size)
        self.fast_project_in = Linear(c.dim, c.fast_dim, bias=True) if c.has_fast_project_in else None
        self.fast_embeddings = nn.Embedding(c.codebook_size, c.fast_dim)
        self.fast_layers = nn.ModuleList(
            Block(c.fast_dim, c.fast_n_head, c.fast_n_local_heads, c.fast_head_dim, c.fast_intermediate_size,
                  c.fast_attention_qk_norm, c.norm_eps) for _ in range(c.n_fast_layer))
        self.fast_norm = RMSNorm(c.fast_dim, c.norm_eps)
        self.fast_output = Linear(c.fast_dim, c.codebook_size)
        self.register_buffer("rope", rope_table(c.max_seq_len, c.head_dim, c.rope_base), persistent=False)
        self.register_buffer("fast_rope", rope_table(c.num_codebooks, c.fast_head_dim, c.fast_rope_base),
                             persistent=False)
        self.register_buffer("main_head", torch.empty(0), persistent=False)
        self.register_buffer("main_head_ids", torch.empty(0, dtype=torch.int64), persistent=False)
        self.register_buffer("fast_head", torch.empty(0), persistent=False)
        # the heads' bf16 rows where the checkpoint's are bf16 (exact), for TTSFLEET_HEAD_GEMM=bf16
        self.register_buffer("main_head_bf16", None, persistent=False)
        self.register_buffer("fast_head_bf16", None, persistent=False)
        self.register_buffer("fast_positions", torch.empty(0, dtype=torch.int64), persistent=False)
        self.quantization: QuantScheme = BF16  # the scheme its projections run (set by quantize_)
        self.restrict_main_head = True  # False: reference path over the whole vocab (tests only)

    # ----------------------------------------------------------------- set-up
    def finalize(self) -> None:
        """After weights are loaded (before quantization): float32 copies of the two sampling heads.

        Only the LM-head rows of the semantic ids + ``<|im_end|>`` can ever be sampled, so the slow
        step computes just them (exact): ``main_head [n_allowed, dim]`` holds the rows of the token ids
        ``main_head_ids = [semantic_begin_id .. semantic_end_id, im_end_id]`` in that order. Both heads
        run in float32 even for a bf16 model: bf16 logits of magnitude ~30 are spaced 0.125 apart,
        which turns near-ties into rounding coin flips.
        """
        c = self.config
        ids = torch.cat([torch.arange(c.semantic_begin_id, c.semantic_end_id + 1),
                         torch.tensor([c.im_end_id])]).to(self.device, torch.int64)
        self.main_head_ids = ids
        main = self._lm_head_weight().detach().index_select(0, ids).contiguous()
        fast = self.fast_output.weight.detach()
        self.main_head = main.float().contiguous()
        self.fast_head = fast.float().clone()
        self.main_head_bf16 = main if main.dtype == torch.bfloat16 else None
        self.fast_head_bf16 = fast.clone() if fast.dtype == torch.bfloat16 else None
        self.fast_positions = torch.arange(c.num_codebooks + 1, device=self.device)

    def quantize_(self, scheme: str) -> None:
        """Quantize every block's projections (slow and fast) to FP8 once; heads/embeddings stay dense.

        ``scheme`` is a name of :mod:`ttsfleet.quantization` (``bf16``, or its alias ``none``: no-op).
        """
        scheme = parse_scheme(scheme)
        if not is_fp8(scheme):
            return
        for blk in [*self.layers, *self.fast_layers]:
            blk.quantize_(scheme)
        self.quantization = scheme

    @property
    def device(self) -> torch.device:
        return self.embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.weight.dtype

    def new_cache(self, max_slots: int, max_seq_len: int, kv_dtype: str = "auto") -> KVCache:
        """A static cache of ``max_slots`` slots x ``max_seq_len`` positions; ``kv_dtype`` in
        :data:`KV_DTYPES` (``fp8``: see "FP8 KV cache" in the module docstring)."""
        c = self.config
        if max_seq_len > c.max_seq_len:
            raise ValueError(f"max_seq_len {max_seq_len} exceeds the model's {c.max_seq_len}")
        check_kv_dtype(kv_dtype)
        dev, dt = self.device, self.dtype
        shape = (c.n_layer, max_slots, max_seq_len, c.n_local_heads, c.head_dim)
        fp8 = kv_dtype == "fp8"
        kv_dt = torch.float8_e4m3fn if fp8 else dt
        scales = {"k_scale": torch.full(shape[:-1], 127, device=dev, dtype=torch.uint8),
                  "v_scale": torch.full(shape[:-1], 127, device=dev, dtype=torch.uint8)} if fp8 else {}
        return KVCache(
            k=torch.zeros(shape, device=dev, dtype=kv_dt), v=torch.zeros(shape, device=dev, dtype=kv_dt),
            lengths=torch.zeros(max_slots, device=dev, dtype=torch.int64),
            steps=torch.zeros(max_slots, device=dev, dtype=torch.int64),
            pending_logits=torch.zeros(max_slots, c.num_semantic + 1, device=dev, dtype=torch.float32),
            pending_hidden=torch.zeros(max_slots, c.fast_dim, device=dev, dtype=dt),
            **scales,
        )

    def kv_bytes_per_position(self, kv_dtype: str = "auto") -> int:
        """K/V bytes one cache position of one slot takes (every layer; exponents included)."""
        check_kv_dtype(kv_dtype)
        c = self.config
        per_head = c.head_dim + 1 if kv_dtype == "fp8" else c.head_dim * self.dtype.itemsize
        return 2 * c.n_layer * c.n_local_heads * per_head

    def release(self, cache: KVCache, slot: int) -> None:
        """Empty ``slot`` (its length, sampling counter and pending logits), queued on the stream.

        Why ``fill_`` and not ``cache.lengths[slot] = 0``: assigning a Python number to one element of
        a CUDA tensor copies it from the host and waits for the stream to drain (torch 2.11; a slice or
        ``fill_`` launches a kernel instead). py-spy of the served engine at c=128 on an H100
        (2026-12-07 call 27) found the engine thread in this line and in the join's slot assignment in
        two thirds of its samples: every retire and join emptied the decode pipeline."""
        cache.lengths[slot].fill_(0)
        cache.steps[slot].fill_(0)
        cache.pending_logits[slot].fill_(0)

    # ----------------------------------------------------------------- slow model
    def embed(self, tokens: Tensor) -> Tensor:
        """``tokens [B, 1 + ncb, T]`` -> ``[B, T, dim]``: token embedding + codebook sum at audio tokens."""
        c = self.config
        main, codes = tokens[:, 0], tokens[:, 1:]
        offs = torch.arange(c.num_codebooks, device=tokens.device, dtype=codes.dtype)[None, :, None]
        codes = codes.clamp(0, c.codebook_size - 1) + offs * c.codebook_size
        vq = self.codebook_embeddings(codes).sum(dim=1)
        is_audio = ((main >= c.semantic_begin_id) & (main <= c.semantic_end_id))[..., None]
        x = self.embeddings(main) + torch.where(is_audio, vq, torch.zeros_like(vq))
        if c.scale_codebook_embeddings:
            x = torch.where(is_audio, x / math.sqrt(c.num_codebooks + 1), x)
        return x

    def _ffn_block(self, blk: Block, h: Tensor) -> Tensor:
        return h + blk.feed_forward(blk.ffn_norm(h))

    def _hand_off(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """Last pre-norm hidden ``[..., dim]`` -> (normed, hidden handed to the fast model)."""
        normed = self.norm(h)
        return normed, self.fast_input(h, normed)

    def fast_input(self, h: Tensor, normed: Tensor) -> Tensor:
        """What the fast model gets from the slow one: S2 the normed hidden, S1 the pre-norm one."""
        to_fast = normed if self.config.fast_input_post_norm else h
        return self.fast_project_in(to_fast) if self.fast_project_in is not None else to_fast

    def _lm_head_weight(self) -> Tensor:
        """The full-vocab LM head ``[vocab, dim]``: the tied embedding or the untied ``output`` weight."""
        return self.embeddings.weight if self.output is None else self.output.weight

    def _lm_head(self, normed: Tensor) -> Tensor:
        w = self.embeddings.weight if self.output is None else None
        return F.linear(normed, w) if w is not None else self.output(normed)

    def codebook_logits(self, normed: Tensor) -> Tensor:
        """Float32 codebook logits ``[..., codebook_size]`` of the fast model's normed hidden."""
        return head_logits(normed, self.fast_head, self.fast_head_bf16)

    def main_logits(self, normed: Tensor) -> Tensor:
        """Float32 main-token logits ``[..., n_allowed]`` (columns in ``main_head_ids`` order)."""
        if self.restrict_main_head:
            return head_logits(normed, self.main_head, self.main_head_bf16)
        full = F.linear(normed.float(), self._lm_head_weight().float())  # [..., vocab]
        return full.index_select(-1, self.main_head_ids)

    def forward_slow(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        """No cache: ``tokens [B, 1 + ncb, T]`` -> (logits ``[B, T, vocab]``, to-fast ``[B, T, fdim]``)."""
        t = tokens.shape[-1]
        x = self.embed(tokens)
        rope = self.rope[:t][None]
        for blk in self.layers:
            q, k, v = blk.attention.qkv(blk.attention_norm(x), rope)
            x = x + blk.attention.wo(attend(q, k, v, None, causal=True))
            x = self._ffn_block(blk, x)
        normed, to_fast = self._hand_off(x)
        return self._lm_head(normed).float(), to_fast

    def _check_prefill(self, cache: KVCache, slot: int, prompt: Tensor, start: int | None,
                       trust_start: bool = False) -> tuple[int, int]:
        """Validate one prefill piece; returns its ``(start, end)`` positions (see :meth:`prefill`)."""
        n = self.config.num_codebooks
        if prompt.dim() != 2 or prompt.shape[0] != 1 + n:
            raise ValueError(f"prompt must be [1 + {n}, T], got {tuple(prompt.shape)}")
        if not 0 <= slot < cache.max_slots:
            raise ValueError(f"slot {slot} is not in [0, {cache.max_slots})")
        t = int(prompt.shape[1])
        if t < 1:
            raise ValueError("prompt chunk is empty")
        if start is None or (start != 0 and not trust_start):  # (reading the length syncs the device)
            held = cache.length(slot)
            start = held if start is None else int(start)
            if not 0 <= start <= held:
                raise ValueError(f"prefill start {start} must be in [0, {held}]: slot {slot} holds {held} "
                                 "tokens")
        end = start + t
        if end >= cache.max_seq_len:
            raise ValueError(f"prefill of positions [{start}, {end}) overflows the cache: the prompt must "
                             f"end before max_seq_len {cache.max_seq_len} (one position is kept for the "
                             "first decoded frame)")
        return start, end

    @torch.inference_mode()
    def prefill(self, cache: KVCache, slot: int, prompt: Tensor, start: int | None = None) -> None:
        """Run ``prompt [1 + ncb, T]`` into ``slot`` at positions ``start .. start+T-1``.

        ``start`` defaults to the slot's current length (0 for a fresh slot), so a long prompt can be
        fed as consecutive chunks; each chunk attends causally to everything before it in the slot.
        The slot keeps the last position's logits / hidden state, so after the final chunk it is in
        the same state as after a one-shot prefill of the whole prompt. ``start == 0`` resets the
        slot's sampling counter.
        """
        start, end = self._check_prefill(cache, slot, prompt, start)
        tokens = prompt.to(self.device, torch.int64)[None]
        if fused_enabled(tokens):
            h, normed = fused.prefill(self, cache, slot, tokens, start)
            self._finish_prefill(cache, slot, h, normed, start, end)
            return
        x = self.embed(tokens)
        rope = self.rope[start:end][None]
        if start:  # query i (position start+i) sees keys 0 .. start+i
            keys = torch.arange(end, device=self.device)
            mask = (keys[None, :] <= torch.arange(start, end, device=self.device)[:, None])[None, None]
        for i, blk in enumerate(self.layers):
            q, k, v = blk.attention.qkv(blk.attention_norm(x), rope)
            cache.store(i, (slot, slice(start, end)), k[0], v[0])
            if start or cache.fp8:  # an FP8 cache: attend what it holds, as decode and the fused path do
                kc, vc = cache.read(i, (slot, slice(None, end)), q.dtype)
                y = attend(q, kc[None], vc[None], mask if start else None, causal=not start)
            else:
                y = attend(q, k, v, None, causal=True)
            x = x + blk.attention.wo(y)
            x = self._ffn_block(blk, x)
        normed, to_fast = self._hand_off(x[:, -1])
        self._finish_prefill(cache, slot, x[:, -1], normed, start, end, to_fast)

    @torch.inference_mode()
    def prefill_batch(self, cache: KVCache, pieces: list[PrefillPiece],
                      graphs: PrefillGraphs | None = None) -> None:
        """Prefill several slots in one variable-length call: each piece as :meth:`prefill` would.

        Why: a model call costs the same host time (and nearly the same weight reads) for one prompt
        or many, so the engine prefills every waiting prompt chunk of an iteration together. The
        pieces' tokens are concatenated into one ``[N, dim]`` row stream (row = one position of one
        slot); the GEMMs and norms run once over all rows, and attention groups the rows back per
        slot (padded, masked SDPA over the slot's cache up to the row's position). Slots must be
        distinct. An explicit ``start`` is trusted (not checked against the slot's length, which would
        cost a device -> host sync per call: the engine keeps the lengths itself); ``start=None``
        reads the slot's length as :meth:`prefill` does. ``graphs`` (captured for ``cache``): the fused
        path's per-row work replays from them when the rows fit a bucket (:mod:`.prefill_graphs`).
        """
        if not pieces:
            return None
        lay, tokens = self.piece_rows(cache, pieces)
        x = self.embed(tokens)[0]  # [N, dim]
        if fused_enabled(tokens):
            whole = graphs.whole_fit(x.shape[0], lay.max_end) if graphs is not None and \
                lay.lone_slot is not None else None
            if whole is not None:
                h, normed = graphs.run_whole(x, lay.pos, lay.row_slots, lay.slots, lay.starts, whole)
            elif graphs is not None and graphs.bucket(x.shape[0]) is not None:
                h, normed = graphs.run(x, lay.pos, lay.row_slots, lay.attend)
            else:
                h, normed = fused.run_blocks(list(self.layers), x, self.rope, lay.pos, cache.k, cache.v,
                                             lay.row_slots, lay.attend, self.norm, cache.k_scale,
                                             cache.v_scale)
            h, normed = h[lay.last], normed[lay.last]
            to_fast = self.fast_input(h, normed)
        else:
            x = x[None]
            rope = self.rope[lay.pos][None]
            for i, blk in enumerate(self.layers):
                q, k, v = blk.attention.qkv(blk.attention_norm(x), rope)
                cache.store(i, (lay.row_slots, lay.pos), k[0], v[0])
                y = lay.attend(q[0], *cache.layer(i))
                x = x + blk.attention.wo(y.reshape(1, y.shape[0], -1))
                x = self._ffn_block(blk, x)
            normed, to_fast = self._hand_off(x[0, lay.last])
        cache.pending_logits[lay.slots] = self.main_logits(normed)
        cache.pending_hidden[lay.slots] = to_fast.to(cache.pending_hidden.dtype)
        self.land_pieces(cache, lay)
        return None

    def piece_rows(self, cache: KVCache, pieces: list[PrefillPiece]) -> tuple[_VarlenLayout, Tensor]:
        """Checked pieces (distinct slots) -> their rows' layout and tokens ``[1, 1 + ncb, N]`` on the
        device, concatenated in piece order."""
        spans = self.piece_spans(cache, pieces)
        lay = _VarlenLayout.build([p.slot for p in pieces], spans, self.device)
        tokens = torch.cat([p.tokens.to(torch.int64) for p in pieces], dim=1)
        return lay, tokens.to(self.device, non_blocking=True)[None]

    def piece_spans(self, cache: KVCache, pieces: list[PrefillPiece]) -> list[tuple[int, int]]:
        """Checked pieces (distinct slots, each fits its slot) -> each one's ``(start, end)`` positions."""
        if len({p.slot for p in pieces}) != len(pieces):
            raise ValueError("prefill_batch needs distinct slots")
        return [self._check_prefill(cache, p.slot, p.tokens, p.start, trust_start=True) for p in pieces]

    def land_pieces(self, cache: KVCache, lay: _VarlenLayout) -> None:
        """The pieces' slots after their rows ran: their lengths, and a fresh slot's sampling counter."""
        cache.lengths[lay.slots] = lay.ends
        cache.steps[lay.slots] = torch.where(lay.starts == 0, 0, cache.steps[lay.slots])

    def _finish_prefill(self, cache: KVCache, slot: int, h: Tensor, normed: Tensor, start: int, end: int,
                        to_fast: Tensor | None = None) -> None:
        """Store the last prompt position's logits / hand-off state; ``h`` pre-norm, ``normed`` after."""
        if to_fast is None:
            to_fast = self.fast_input(h, normed)
        cache.pending_logits[slot] = self.main_logits(normed)[0]
        cache.pending_hidden[slot] = to_fast[0]
        cache.lengths[slot].fill_(end)  # fill_: no host copy, no sync (see :meth:`release`)
        if start == 0:
            cache.steps[slot].fill_(0)

    def _slow_step(self, cache: KVCache, slots: Tensor, frame: Tensor) -> None:
        """One slow position for each row: ``frame [bs, 1 + ncb]`` appended at the slot's length."""
        s = cache.max_seq_len
        pos = cache.lengths[slots].clamp(max=s - 1)
        x = self.embed(frame[:, :, None])  # [bs, 1, dim]
        rope = self.rope[pos][:, None]  # [bs, 1, D/2, 2]
        n_keys = pos + 1
        for i, blk in enumerate(self.layers):
            q, k, v = blk.attention.qkv(blk.attention_norm(x), rope)
            cache.store(i, (slots, pos), k[:, 0], v[:, 0])
            kc, vc, ks, vs = cache.layer(i)
            y = decode_attention(q[:, 0], kc, vc, slots, n_keys, 0, ks, vs)
            x = x + blk.attention.wo(y.reshape(y.shape[0], 1, -1))
            x = self._ffn_block(blk, x)
        normed, to_fast = self._hand_off(x[:, 0])
        cache.pending_logits[slots] = self.main_logits(normed)
        cache.pending_hidden[slots] = to_fast
        cache.lengths[slots] = pos + 1

    # ----------------------------------------------------------------- fast model
    def _fast_layers_step(self, x: Tensor, pos: int, fk: Tensor, fv: Tensor) -> Tensor:
        """One fast position ``x [bs, 1, fast_dim]`` at ``pos`` with the frame-local KV ``fk``/``fv``."""
        n = self.config.num_codebooks
        rope = self.fast_rope[pos:pos + 1][None]
        mask = (torch.arange(n, device=x.device) <= pos)[None, None, None, :]
        for i, blk in enumerate(self.fast_layers):
            q, k, v = blk.attention.qkv(blk.attention_norm(x), rope)
            fk[i][:, pos] = k[:, 0]
            fv[i][:, pos] = v[:, 0]
            x = x + blk.attention.wo(attend(q, fk[i], fv[i], mask))
            x = self._ffn_block(blk, x)
        return x

    def fast_logits(self, hidden: Tensor, codes: Tensor) -> Tensor:
        """Teacher-forced fast model: ``hidden [B, fast_dim]``, ``codes [B, ncb]`` -> ``[B, ncb, cb_size]``.

        Position 0 is ``hidden``, position k the embedding of ``codes[:, k-1]``.
        """
        n = self.config.num_codebooks
        x = torch.cat([hidden[:, None].to(self.dtype), self.fast_embeddings(codes[:, : n - 1])], dim=1)
        rope = self.fast_rope[:n][None]
        for blk in self.fast_layers:
            q, k, v = blk.attention.qkv(blk.attention_norm(x), rope)
            x = x + blk.attention.wo(attend(q, k, v, None, causal=True))
            x = self._ffn_block(blk, x)
        return self.codebook_logits(self.fast_norm(x))

    def _fast_decode(self, hidden: Tensor, cb0: Tensor, sampling: SamplingBatch, window: Tensor | None,
                     step: Tensor) -> Tensor:
        c = self.config
        bs, n = hidden.shape[0], c.num_codebooks
        shape = (c.n_fast_layer, bs, n, c.fast_n_local_heads, c.fast_head_dim)
        fk = torch.zeros(shape, device=hidden.device, dtype=self.dtype)
        fv = torch.zeros_like(fk)
        self._fast_layers_step(hidden[:, None].to(self.dtype), 0, fk, fv)
        codes = [cb0]
        for k in range(1, n):
            x = self._fast_layers_step(self.fast_embeddings(codes[-1])[:, None], k, fk, fv)
            logits = self.codebook_logits(self.fast_norm(x[:, 0]))
            win = None if window is None else window[:, :, k]
            codes.append(sample(logits, sampling, step, draw=1 + k, window=win))
        return torch.stack(codes, dim=1)

    # ----------------------------------------------------------------- decode
    @torch.inference_mode()
    def decode_step(self, cache: KVCache, slots: Tensor, sampling: SamplingBatch,
                    window: Tensor | None = None) -> Tensor:
        """Advance each slot by one frame; returns ``[bs, 1 + ncb]`` int64 ``[main, cb0..]`` rows."""
        slots = slots.to(self.device, torch.int64)
        frame = self.decode_front(cache, slots, sampling, window)
        if fused_enabled(cache.pending_logits):
            fused.slow_step(self, cache, slots, frame)
        else:
            self._slow_step(cache, slots, frame)
        return frame

    @torch.inference_mode()
    def decode_front(self, cache: KVCache, slots: Tensor, sampling: SamplingBatch,
                     window: Tensor | None = None) -> Tensor:
        """A decode step's first half: each slot's frame ``[bs, 1 + ncb]`` sampled from its pending
        logits through the fast model, its sampling counter advanced; the slow model has not seen
        the frame yet (:meth:`decode_step` appends it; a mixed step, :meth:`decode_with_prefill`)."""
        c = self.config
        slots = slots.to(self.device, torch.int64)
        step = cache.steps[slots]
        win0 = None if window is None else window[:, :, 0]
        fused_path = fused_enabled(cache.pending_logits)
        pick_main = fused.sample_main_fused if fused_path else sample_main
        idx = pick_main(cache.pending_logits[slots], sampling, step, win0, end_index=c.num_semantic)
        is_end = idx == c.num_semantic  # main-head row -> codebook-0 code (end: 0) and token id
        cb0 = torch.where(is_end, torch.zeros_like(idx), idx)
        main = self.main_head_ids[idx]
        hidden = cache.pending_hidden[slots]
        if fused_path:
            codes = fused.fast_decode(self, hidden, cb0, sampling, window, step)
        else:
            codes = self._fast_decode(hidden, cb0, sampling, window, step)
        cache.steps[slots] = step + 1
        return torch.cat([main[:, None], codes], dim=1)

    @torch.inference_mode()
    def decode_with_prefill(self, cache: KVCache, slots: Tensor, frame: Tensor, pieces: list[PrefillPiece],
                            graphs: PrefillGraphs | None = None) -> None:
        """A decode step's second half for ``slots`` (their ``frame`` from :meth:`decode_front`
        appended) and the prefill ``pieces`` (other slots) in one pass through the slow model: the
        same cache state as :meth:`_slow_step` then :meth:`prefill_batch`. On the fused path their rows
        share every GEMM (:mod:`.mixed_step`: one weight read where two calls read twice); elsewhere
        it is those two calls."""
        if not pieces:
            raise ValueError("decode_with_prefill needs at least one prefill piece")
        slots = slots.to(self.device, torch.int64)
        if not fused_enabled(cache.pending_logits):
            self._slow_step(cache, slots, frame)
            self.prefill_batch(cache, pieces)
            return
        from .mixed_step import mixed_slow_pass

        mixed_slow_pass(self, cache, slots, frame, pieces, graphs)

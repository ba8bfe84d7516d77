"""Piecewise CUDA graphs of the fused prefill: the per-row work between two attentions, per row bucket.

Why: a prefill call on the H200 cost the host 47-72 ms for ~8 ms of GPU work (S2 Pro, one 300-400
token prompt; benchmarks/inference_h200/2026-12-02-ab/run4-sdpa-no-cudnn/prefill_host.txt), and
the engine thread cannot decode meanwhile: ~25 launches per layer, each paying PyTorch's or
Triton's host cost (``_scaled_mm`` alone 94 us of CPU per call). Everything in a block except
attention is per row (norms, GEMMs, RoPE + K/V store), so it can run on padded rows from a graph
captured once per row count; attention mixes rows of a piece and is the only thing left eager (as
vLLM's piecewise graphs do). A call of ``n`` rows pads to the smallest bucket ``>= n``: the padded
rows run the same kernels on stale, finite data and write their K/V into a scratch slot, and their
results are never read. Segment ``s`` = block ``s-1``'s second half + block ``s``'s first half
(:func:`~ttsfleet.inference.fused.leave_block` / :func:`~ttsfleet.inference.fused.enter_block`);
segment 0 starts at the embeddings, the last ends in the final norm.

State crosses segments only through buffers allocated here, outside the graph pool (the stream,
the queries, the attention output), so all buckets' graphs share one pool for their temporaries.
Without CUDA (tests, the Triton interpreter) :class:`PrefillGraphs` runs the same segments eagerly
on the same padded buffers, so the padding and the hand-over are checked on CPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from ttsfleet.kernels import decode as kd

from . import fused

if TYPE_CHECKING:
    from .model import DualARModel, KVCache

log = logging.getLogger(__name__)

#: Smallest bucket: prompt pieces are rarely shorter, and padding a few rows costs little.
MIN_ROWS = 64


def row_buckets(max_rows: int, min_rows: int = MIN_ROWS) -> list[int]:
    """Row counts a prefill call pads to: ``min_rows`` steps up to 8x that, then four per doubling
    (each at most 25 % above the one below), ending at ``max_rows`` (multiples of 4, as cuBLAS's
    block-scaled GEMM wants its rows)."""
    if max_rows < 1 or min_rows < 4 or min_rows % 4:
        raise ValueError(f"row buckets need max_rows >= 1 and min_rows a multiple of 4 >= 4, got {max_rows}, "
                         f"{min_rows}")
    top = -(-max_rows // 4) * 4
    out, size = [], min_rows
    while size < top:
        out.append(size)
        step = min_rows if size < 8 * min_rows else 1 << (size.bit_length() - 3)
        size += step
    return [*out, top]


class PrefillGraphs:
    """The fused prefill's per-row segments for each row bucket: captured graphs on CUDA, else eager.

    ``scratch_slot``: a cache slot no request uses (the engine's pad slot); padded rows store there.
    """

    def __init__(self, model: DualARModel, cache: KVCache, scratch_slot: int, buckets: list[int]) -> None:
        if not 0 <= scratch_slot < cache.max_slots:
            raise ValueError(f"scratch slot {scratch_slot} is not in [0, {cache.max_slots})")
        c, top = model.config, max(buckets)
        dev, dt = model.device, model.dtype
        self.model, self.cache, self.scratch_slot = model, cache, scratch_slot
        self.buckets = sorted(buckets)
        self.blocks = list(model.layers)
        head = self.blocks[0].attention
        self.x = torch.zeros(top, c.dim, device=dev, dtype=dt)  # the residual stream
        self.normed = torch.zeros(top, c.dim, device=dev, dtype=dt)
        self.q = torch.zeros(top, head.n_head, head.head_dim, device=dev, dtype=dt)
        self.y = torch.zeros(top, head.n_head * head.head_dim, device=dev, dtype=dt)  # attention out
        self.pos = torch.zeros(top, device=dev, dtype=torch.int64)
        self.slots = torch.full((top,), scratch_slot, device=dev, dtype=torch.int64)
        # padded rows: distinct scratch positions (no two rows store to one place)
        self.pad_pos = torch.arange(top, device=dev, dtype=torch.int64) % cache.max_seq_len
        self.graphs: dict[int, list[torch.cuda.CUDAGraph]] = {}

    # ------------------------------------------------------------------ segments
    @property
    def n_segments(self) -> int:
        return len(self.blocks) + 1

    def _segment(self, s: int, rows: int) -> None:
        """Segment ``s`` on the first ``rows`` rows of the static buffers (what a graph captures)."""
        m, cache = self.model, self.cache
        x = self.x[:rows]
        branch = None
        if s:
            branch, x = fused.leave_block(self.blocks[s - 1], self.y[:rows], x)
        if s == len(self.blocks):
            normed, x = kd.rmsnorm(x, m.norm.weight, m.norm.eps, branch)
            self.normed[:rows].copy_(normed)
        else:
            kv = fused.layer_kv(cache.k, cache.v, cache.k_scale, cache.v_scale, s)
            q, x = fused.enter_block(self.blocks[s], x, branch, m.rope, self.pos[:rows], kv,
                                     self.slots[:rows])
            self.q[:rows].copy_(q)
        if x.data_ptr() != self.x.data_ptr():
            self.x[:rows].copy_(x)

    def _run_segment(self, s: int, rows: int) -> None:
        graphs = self.graphs.get(rows)
        if graphs is None:
            self._segment(s, rows)
        else:
            graphs[s].replay()

    # ------------------------------------------------------------------ use
    def bucket(self, n: int) -> int | None:
        """The smallest bucket holding ``n`` rows (None: more rows than the largest)."""
        return next((b for b in self.buckets if b >= n), None)

    def run(self, x: Tensor, pos: Tensor, row_slots: Tensor,
            attend: Callable[..., Tensor]) -> tuple[Tensor, Tensor]:
        """:func:`~ttsfleet.inference.fused.run_blocks` over the prefill rows ``x [n, dim]`` (row r at
        ``pos[r]`` of slot ``row_slots[r]``), ``attend`` eager between the segments -> (pre-norm
        hidden, normed) of the ``n`` rows (views of static buffers: valid until the next call)."""
        n = int(x.shape[0])
        rows = self.bucket(n)
        if rows is None:
            raise ValueError(f"{n} prefill rows exceed the largest row bucket {self.buckets[-1]}")
        self.x[:n].copy_(x)
        self.pos[:n].copy_(pos)
        self.slots[:n].copy_(row_slots)
        self.pos[n:rows].copy_(self.pad_pos[:rows - n])
        self.slots[n:rows].fill_(self.scratch_slot)
        cache = self.cache
        for s, blk in enumerate(self.blocks):
            self._run_segment(s, rows)
            kv = fused.layer_kv(cache.k, cache.v, cache.k_scale, cache.v_scale, s)
            self.y[:n].copy_(fused.attend_block(blk, self.q[:n], kv, attend))
        self._run_segment(len(self.blocks), rows)
        return self.x[:n], self.normed[:n]

    # ------------------------------------------------------------------ capture
    def capture(self) -> None:
        """One graph per segment per bucket (CUDA only), largest bucket first; each bucket's
        segments run once eagerly before capture (Triton compiles, cuBLAS picks its kernels)."""
        if self.model.device.type != "cuda":
            raise RuntimeError("prefill graphs need a CUDA device")
        pool = torch.cuda.graph_pool_handle()
        t0 = time.perf_counter()
        try:
            for rows in reversed(self.buckets):
                self.slots[:rows].fill_(self.scratch_slot)
                self.pos[:rows].copy_(self.pad_pos[:rows])
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for s in range(self.n_segments):
                        self._segment(s, rows)
                torch.cuda.current_stream().wait_stream(side)
                graphs = []
                for s in range(self.n_segments):
                    g = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(g, pool=pool):
                        self._segment(s, rows)
                    graphs.append(g)
                self.graphs[rows] = graphs
            torch.cuda.synchronize()
        finally:
            self.model.release(self.cache, self.scratch_slot)
        log.info("captured prefill graphs for %d row buckets (%d..%d rows, %d segments each) in %.1f s",
                 len(self.graphs), self.buckets[0], self.buckets[-1], self.n_segments,
                 time.perf_counter() - t0)

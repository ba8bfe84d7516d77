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
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import Tensor
from ttsfleet.kernels import decode as kd
from ttsfleet.kernels.reference import dequantize_kv
from ttsfleet.kernels.workspaces import new_owner, workspace_scope

from ttsfleet.switches import ProcessSwitch, one_of

from . import fused
from .graph_capture import capture_after_warmup, on_side_stream
from .mixed_graphs import MIXED_GRAPH_SWITCH, MixedStepInputs, mixed_step_body
from .model_layers import attend as sdpa_attend

if TYPE_CHECKING:
    from .model import DualARModel, KVCache, PrefillPiece

log = logging.getLogger(__name__)

#: Smallest bucket: prompt pieces are rarely shorter, and padding a few rows costs little.
MIN_ROWS = 64

#: Whole-call graphs for one-piece calls (``on``), attention inside them, or the piecewise graphs alone
#: (``off``, the default). Why: a one-prompt call from the piecewise graphs is still host-bound — done
#: in 10.9 ms, its host time 10.7 ms (H200, 2026-12-02-graphs run6) — since its 36 attentions run
#: eagerly between 37 replays; at c=128 about one prompt arrives per decode step, so the engine thread
#: spends ~10 ms a step there. A one-piece call (the common one: a prompt or its next chunk) can attend
#: inside a graph: its slot and start are device tensors; a fresh piece attends causally over its own
#: rows, a continuing one over keys padded to a static length and masked (``WholeAttend``); one replay
#: for the call. Served once on an H100 (2026-12-06d call 16): the prefill phase's host time halved,
#: frames/s -6.9 % at c=64, every whole graph's attention then masked and, with native GQA, on SDPA's
#: math kernel; fresh pieces causal and masked calls on expanded heads since (``next_calls.sh 17``, 16).
WHOLE_ENV = "TTSFLEET_PREFILL_WHOLE_GRAPHS"
WHOLE_SWITCH: ProcessSwitch[str] = ProcessSwitch(WHOLE_ENV, "off", one_of(WHOLE_ENV, ("off", "on"), "off"))
#: Largest one-piece call a whole graph takes, in rows, unless the engine passes its prefill chunk: a
#: whole prompt of the benchmark's length (~350 tokens; ``speed_run.sh`` serves whole prompts up to 512).
WHOLE_MAX_ROWS = 512
#: Smallest key length a whole graph attends over; then doubling up to the cache's length.
MIN_KEYS = 256


def key_buckets(max_seq_len: int, min_keys: int = MIN_KEYS) -> list[int]:
    """Key lengths a whole graph pads its slot's keys to: ``min_keys`` doubling, ending at the
    cache's length (each at most twice the one below: attention over at most 2x the keys needed)."""
    out, size = [], min_keys
    while size < max_seq_len:
        out.append(size)
        size *= 2
    return [*out, max_seq_len]


#: The key length a fresh piece's whole graph is keyed by: a piece from position 0 attends causally
#: over its own rows (no mask: flash attention with native GQA), where a continuing piece's keys are
#: padded to a static length and masked (the memory-efficient kernel on expanded heads).
FRESH = 0


class WholeAttend:
    """One piece's attention with static shapes, for a graph: the rows' queries against the first
    ``keys`` positions of the slot in ``slot`` (a device tensor), query ``i`` seeing keys ``0 .. start
    + i`` (``start`` a device tensor too); ``keys`` :data:`FRESH`: a piece from position 0, query ``i``
    seeing the slot's keys ``0 .. i`` (causal, no mask). Padded queries past the piece see stale keys
    of the slot, finite, and their outputs are never read."""

    def __init__(self, slot: Tensor, start: Tensor, row_idx: Tensor, key_idx: Tensor, keys: int) -> None:
        self.slot, self.start, self.keys = slot, start, keys
        self.row_idx, self.key_idx = row_idx, key_idx[:keys]

    def __call__(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, k_scale: Tensor | None = None,
                 v_scale: Tensor | None = None) -> Tensor:
        rows = q.shape[0]
        keys = self.keys or rows

        def gather(cache: Tensor) -> Tensor:  # [1, keys, ...]: the slot's first keys, copied
            return cache[:, :keys].index_select(0, self.slot)

        k, v = gather(k_cache), gather(v_cache)
        if k_scale is not None and v_scale is not None:
            k, v = dequantize_kv(k, gather(k_scale), q.dtype), dequantize_kv(v, gather(v_scale), q.dtype)
        if self.keys == FRESH:
            return sdpa_attend(q[None], k, v, None, causal=True).reshape(rows, *q.shape[1:])
        seen = self.start + self.row_idx[:rows]  # the last key each query sees
        mask = (self.key_idx[None, :] <= seen[:, None])[None, None]
        return sdpa_attend(q[None], k, v, mask).reshape(rows, *q.shape[1:])


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

    def __init__(self, model: DualARModel, cache: KVCache, scratch_slot: int, buckets: list[int],
                 whole: bool | None = None, keys: list[int] | None = None,
                 whole_max_rows: int = WHOLE_MAX_ROWS, attending: bool = False) -> None:
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
        # whole-call graphs (:data:`WHOLE_SWITCH`): one per (row bucket, key length) of a one-piece call
        self.whole = WHOLE_SWITCH.get() == "on" if whole is None else whole
        self.whole_rows = [b for b in self.buckets if b <= whole_max_rows] or self.buckets[:1]
        # a fresh piece attends over its own padded rows, so they must fit the slot
        self.fresh_rows = [b for b in self.whole_rows if b <= cache.max_seq_len]
        self.key_lengths = key_buckets(cache.max_seq_len) if keys is None else sorted(keys)
        self.lone_slot = torch.zeros(1, device=dev, dtype=torch.int64)
        self.lone_start = torch.zeros(1, device=dev, dtype=torch.int64)
        self.row_idx = torch.arange(top, device=dev, dtype=torch.int64)
        self.key_idx = torch.arange(max(self.key_lengths), device=dev, dtype=torch.int64)
        self.whole_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        # where ``attending`` (mixed steps), every segment again with each row's attention inside
        # (:meth:`run_attending`: row r attends to keys 0 .. att_len[r] - 1 of its slot), captured as
        # one graph per bucket: nothing runs between those segments, so the pass is one replay (it
        # was 37 segment replays a step until 2026-12-07)
        self.attending = attending
        self.att_len = self.pad_pos + 1
        self.attending_graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # with attending and TTSFLEET_MIXED_GRAPH=step: the whole mixed step's slow half per bucket
        # instead (:mod:`.mixed_graphs`); by default its set-up and hand-off stay eager around
        # :meth:`run_attending`
        step = attending and MIXED_GRAPH_SWITCH.get() == "step"
        self.mixed_inputs = MixedStepInputs(self) if step else None
        self.mixed_step_graphs: dict[int, torch.cuda.CUDAGraph] = {}

    # ------------------------------------------------------------------ segments
    @property
    def n_segments(self) -> int:
        return len(self.blocks) + 1

    def _segment(self, s: int, rows: int, attending: bool = False) -> None:
        """Segment ``s`` on the first ``rows`` rows of the static buffers (what a graph captures);
        ``attending``: block ``s``'s attention too, every row over its own slot's first ``att_len``
        keys (decode attention: one query a row, whatever slot the rows share)."""
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
            if attending:
                y = fused.decode_attend(self.slots[:rows], self.att_len[:rows])(q, *kv)
                self.y[:rows].copy_(y.reshape(rows, -1))
            else:
                self.q[:rows].copy_(q)
        if x.data_ptr() != self.x.data_ptr():
            self.x[:rows].copy_(x)

    def _run_segment(self, s: int, rows: int) -> None:
        graphs = self.graphs.get(rows)
        if graphs is None:
            self._segment(s, rows)
        else:
            graphs[s].replay()

    def attending_pass(self, rows: int) -> None:
        """Every segment with its attention inside on the first ``rows`` static rows (what one
        attending graph captures)."""
        for s in range(self.n_segments):
            self._segment(s, rows, attending=True)

    # ------------------------------------------------------------------ use
    def bucket(self, n: int) -> int | None:
        """The smallest bucket holding ``n`` rows (None: more rows than the largest)."""
        return next((b for b in self.buckets if b >= n), None)

    def run(self, x: Tensor, pos: Tensor, row_slots: Tensor,
            attend: Callable[..., Tensor]) -> tuple[Tensor, Tensor]:
        """:func:`~ttsfleet.inference.fused.run_blocks` over the prefill rows ``x [n, dim]`` (row r at
        ``pos[r]`` of slot ``row_slots[r]``), ``attend`` eager between the segments -> (pre-norm
        hidden, normed) of the ``n`` rows (views of static buffers: valid until the next call)."""
        n, rows = self._load_bucketed(x, pos, row_slots)
        cache = self.cache
        for s, blk in enumerate(self.blocks):
            self._run_segment(s, rows)
            kv = fused.layer_kv(cache.k, cache.v, cache.k_scale, cache.v_scale, s)
            self.y[:n].copy_(fused.attend_block(blk, self.q[:n], kv, attend))
        self._run_segment(len(self.blocks), rows)
        return self.x[:n], self.normed[:n]

    def run_attending(self, x: Tensor, pos: Tensor, row_slots: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`run` with each row's attention inside the segments, row r over keys 0 .. ``pos[r]``
        of slot ``row_slots[r]`` (its own K/V stored just before): a decode row's attention, and a prompt
        row's causal attention over its slot. The whole call is one replay (all segments in one graph
        per bucket since 2026-12-07), no eager attention between the segments (a mixed step's 36 eager
        split attentions cost the host 5-8 ms a step on an H100, 2026-12-06g). A prompt row reads its
        slot's keys once per row, which the prefill's own attention reads once per call: fine for the
        short pieces a mixed step carries."""
        n, rows = self._load_bucketed(x, pos, row_slots)
        torch.add(self.pos[:rows], 1, out=self.att_len[:rows])
        graph = self.attending_graphs.get(rows)
        if graph is None:
            self.attending_pass(rows)
        else:
            graph.replay()
        return self.x[:n], self.normed[:n]

    def run_mixed_step(self, frame: Tensor, slots: Tensor, pieces: list[PrefillPiece],
                       spans: list[tuple[int, int]]) -> bool:
        """A mixed step's slow half (``frame [bs, 1 + ncb]`` appended to ``slots``, the ``pieces`` at
        ``spans`` prefilled) from one replay (:mod:`.mixed_graphs`), or the same work eagerly without
        its graph; False (nothing done) where the step's rows exceed the largest bucket."""
        inputs = self.mixed_inputs
        if inputs is None:
            raise RuntimeError("mixed-step graphs need attending=True and TTSFLEET_MIXED_GRAPH=step")
        bs = int(frame.shape[0])
        rows = self.bucket(bs + sum(end - start for start, end in spans))
        if rows is None:
            return False
        inputs.pack(bs, pieces, spans, rows)
        inputs.load(frame, slots)
        graph = self.mixed_step_graphs.get(rows)
        if graph is None:
            mixed_step_body(self, inputs, rows)
        else:
            graph.replay()
        return True

    def _load_bucketed(self, x: Tensor, pos: Tensor, row_slots: Tensor) -> tuple[int, int]:
        """:meth:`_load` at the smallest row bucket holding the call's rows -> (rows, the bucket); more
        rows than the largest bucket are a ``ValueError``."""
        n = int(x.shape[0])
        rows = self.bucket(n)
        if rows is None:
            raise ValueError(f"{n} prefill rows exceed the largest row bucket {self.buckets[-1]}")
        self._load(x, pos, row_slots, rows)
        return n, rows

    def _load(self, x: Tensor, pos: Tensor, row_slots: Tensor, rows: int) -> None:
        """The call's rows into the static buffers; rows ``n .. rows`` padded (scratch slot)."""
        n = int(x.shape[0])
        self.x[:n].copy_(x)
        self.pos[:n].copy_(pos)
        self.slots[:n].copy_(row_slots)
        self.pos[n:rows].copy_(self.pad_pos[:rows - n])
        self.slots[n:rows].fill_(self.scratch_slot)

    # ------------------------------------------------------------------ whole-call graphs
    def whole_fit(self, n: int, max_end: int) -> tuple[int, int] | None:
        """The (row bucket, key length) a one-piece call of ``n`` rows ending at ``max_end`` runs at
        from a whole graph — key length :data:`FRESH` for a piece from position 0 — or None (whole
        graphs off, too many rows or keys)."""
        if not self.whole:
            return None
        rows = next((b for b in self.whole_rows if b >= n), None)
        if max_end == n and rows in self.fresh_rows:  # from position 0
            return rows, FRESH
        keys = next((k for k in self.key_lengths if k >= max_end), None)
        return None if rows is None or keys is None else (rows, keys)

    def _whole(self, rows: int, keys: int) -> None:
        """The whole call on the first ``rows`` static rows, attention over ``keys`` of the slot in
        :attr:`lone_slot` (what a whole graph captures)."""
        m, cache = self.model, self.cache
        attend = WholeAttend(self.lone_slot, self.lone_start, self.row_idx, self.key_idx, keys)
        x, normed = fused.run_blocks(self.blocks, self.x[:rows], m.rope, self.pos[:rows], cache.k, cache.v,
                                     self.slots[:rows], attend, m.norm, cache.k_scale, cache.v_scale)
        self.normed[:rows].copy_(normed)
        self.x[:rows].copy_(x)

    def run_whole(self, x: Tensor, pos: Tensor, row_slots: Tensor, slot: Tensor, start: Tensor,
                  fit: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """One piece's call (``slot`` and ``start``: one-element device tensors) at ``fit`` (from
        :meth:`whole_fit`): one replay, or the same work eagerly without its graph -> (pre-norm
        hidden, normed) of the ``n`` rows (views of static buffers: valid until the next call)."""
        n, (rows, keys) = int(x.shape[0]), fit
        self._load(x, pos, row_slots, rows)
        self.lone_slot.copy_(slot)
        self.lone_start.copy_(start)
        graph = self.whole_graphs.get(fit)
        if graph is None:
            self._whole(rows, keys)
        else:
            graph.replay()
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
            # the kernels' workspaces these graphs bake: made by the warm-ups, shared by no eager launch
            with workspace_scope(new_owner("prefill-graphs")):
                for rows in reversed(self.buckets):
                    self.slots[:rows].fill_(self.scratch_slot)
                    self.pos[:rows].copy_(self.pad_pos[:rows])
                    self.graphs[rows] = self._capture_segments(rows, pool)
                    if self.mixed_inputs is not None:  # every row and output padded while captured
                        self.mixed_inputs.pack_pads(0, 0, rows)
                        self.mixed_inputs.device.copy_(torch.from_numpy(self.mixed_inputs.host))
                        self.mixed_step_graphs[rows], _ = capture_after_warmup(
                            partial(mixed_step_body, self, self.mixed_inputs, rows), pool, warmups=1)
                    elif self.attending:
                        torch.add(self.pos[:rows], 1, out=self.att_len[:rows])
                        self.attending_graphs[rows], _ = capture_after_warmup(
                            partial(self.attending_pass, rows), pool, warmups=1)
                if self.whole:
                    try:
                        self._capture_whole(pool)
                    except Exception:  # the piecewise graphs still serve every call
                        log.exception("whole-call prefill graph capture failed; one-piece calls use the "
                                      "segments")
                        self.whole, self.whole_graphs = False, {}
            torch.cuda.synchronize()
        finally:
            self.model.release(self.cache, self.scratch_slot)
        log.info("captured prefill graphs for %d row buckets (%d..%d rows, %d segments each%s)%s in %.1f s",
                 len(self.graphs), self.buckets[0], self.buckets[-1], self.n_segments,
                 (", and one graph of the whole mixed step" if self.mixed_inputs is not None else
                  ", and one graph with attention inside" if self.attending else ""),
                 f", {len(self.whole_graphs)} whole-call graphs (rows {self.whole_rows} x keys "
                 f"{['fresh', *self.key_lengths]})" if self.whole else "", time.perf_counter() - t0)

    def _capture_segments(self, rows: int, pool: object) -> list[torch.cuda.CUDAGraph]:
        """One bucket's segments run once eagerly on a side stream, then each captured."""
        with on_side_stream():
            for s in range(self.n_segments):
                self._segment(s, rows)
        graphs = []
        for s in range(self.n_segments):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                self._segment(s, rows)
            graphs.append(g)
        return graphs

    def _capture_whole(self, pool: object) -> None:
        """A whole graph per (row bucket, key length) that can hold it, the scratch slot attended
        (its keys are stale, finite). Each runs once eagerly on a side stream first."""
        self.lone_slot.fill_(self.scratch_slot)
        self.lone_start.zero_()
        fresh = [(rows, FRESH) for rows in reversed(self.fresh_rows)]
        padded = [(rows, keys) for keys in reversed(self.key_lengths) for rows in reversed(self.whole_rows)
                  if rows <= keys]
        for rows, keys in fresh + padded:
            self.slots[:rows].fill_(self.scratch_slot)
            self.pos[:rows].copy_(self.pad_pos[:rows])
            self.whole_graphs[(rows, keys)], _ = capture_after_warmup(partial(self._whole, rows, keys), pool,
                                                                      warmups=1)

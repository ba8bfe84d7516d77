"""A mixed step's whole slow half in one CUDA graph per row bucket: inputs packed on the host, copied once.

Why: with the attending pass in a graph (:meth:`~ttsfleet.inference.prefill_graphs.PrefillGraphs.
run_attending`), a mixed step still costs the engine thread ~60 eager torch calls around it: the pieces'
row layout (numpy, then several host -> device copies), two embeddings (~10 launches each), the
concatenations, loading the static buffers, the last rows' gather, the main head, the hand-off state
and the cache's lengths. Every torch call lets go of the interpreter, and at c=128 on an H100
(2026-12-06h) getting it back took 0.39 ms on average while the event loop wrote 128 streams: the
launch phase was 7.1 ms of a 21.3 ms step. With ``TTSFLEET_MIXED_GRAPH=step`` the host packs
everything a step needs into one int64 array (numpy only: no torch call, so no release), and the step
is three torch calls — the array's copy in, the decode rows' frames and slots copied beside it on the
device — and one replay, whose graph embeds the rows, runs the attending pass, and writes the logits,
hand-off state, lengths and sampling counters of every decode row and every piece's last row.

Padded rows (past the step's rows, up to the bucket) sit in the scratch slot at distinct positions,
as the prefill's do; padded outputs go to the scratch slot and leave its length as it was. Without
CUDA the same body runs eagerly on the same buffers, so the CPU tests check the packing and the body.

``TTSFLEET_MIXED_GRAPH``: ``pass`` (the default: the attending pass alone in a graph, its set-up and
hand-off eager) or ``step`` (this module). Served side by side on an H100 (2026-12-07, ``next_calls.sh
30``, short prompts, one round): the engine's launch phase fell as built for, 3.4 -> 2.6 ms a step at
c=64 and 5.6 -> 2.4 at c=128, but frames/s did not follow: c=64 4,584 -> 4,513 (-1.5 %), c=128 5,868
-> 5,291 (-9.8 %; that side's batch averaged 85 rows against 124, its first audio p99 6.5 s, where
``step`` on both sides of the next call gave 123 rows, 5,710-5,808 frames/s and p99 729-845 ms). At
c=128 the step is paced by the GPU's 17.7 ms and the engine thread's ``other`` phase (13-16 ms, its
waits for the interpreter included), so the launches saved went to waiting elsewhere. Not the
default, then; kept for the day the host's other costs are gone (``benchmarks/inference_h200/README.md``,
twenty-second session).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from ttsfleet.switches import ProcessSwitch, one_of

if TYPE_CHECKING:
    from .model import PrefillPiece
    from .prefill_graphs import PrefillGraphs

MIXED_GRAPH_ENV = "TTSFLEET_MIXED_GRAPH"
MIXED_GRAPH_SWITCH: ProcessSwitch[str] = ProcessSwitch(MIXED_GRAPH_ENV, "pass",
                                                       one_of(MIXED_GRAPH_ENV, ("pass", "step"), "pass"))

#: The per-row fields of the packed array, one row each of ``[fields, top]``: the row's slot, its
#: position if it is a prompt row, whether it is a decode row (its position is then its slot's length),
#: and per output ``o`` (one per decode row, then one per piece): the row it reads, whether it is real
#: and whether its slot's sampling counter starts over (a piece from position 0).
FIELDS = ("slot", "piece_pos", "is_decode", "last", "valid", "reset")


class MixedStepInputs:
    """The static inputs of the mixed-step graphs (device) and their host twin, one int64 array each:
    ``tok [top, 1 + ncb]`` then ``meta [len(FIELDS), top]``."""

    def __init__(self, graphs: PrefillGraphs) -> None:
        top, width = graphs.buckets[-1], 1 + graphs.model.config.num_codebooks
        self.top, self.width, self.scratch = top, width, graphs.scratch_slot
        size = top * width + len(FIELDS) * top
        self.device = torch.zeros(size, dtype=torch.int64, device=graphs.model.device)
        self.host = np.zeros(size, dtype=np.int64)
        self.tok, self.meta = self._views(self.device)
        self.host_tok, self.host_meta = self._views(self.host)
        self.pad_pos = np.arange(top, dtype=np.int64) % graphs.cache.max_seq_len
        self.pack_pads(0, 0, top)

    def _views(self, flat: Tensor | np.ndarray) -> tuple:
        split = self.top * self.width
        return flat[:split].reshape(self.top, self.width), flat[split:].reshape(len(FIELDS), self.top)

    def field(self, name: str) -> Tensor:
        """The device row of ``name`` (all ``top`` entries)."""
        return self.meta[FIELDS.index(name)]

    def pack_pads(self, rows_from: int, outs_from: int, rows: int) -> None:
        """Host: rows ``rows_from .. rows`` and outputs ``outs_from .. rows`` padded."""
        slot, piece_pos, is_decode, last, valid, reset = self.host_meta
        slot[rows_from:rows] = self.scratch
        piece_pos[rows_from:rows] = self.pad_pos[rows_from:rows]
        is_decode[rows_from:rows] = 0
        last[outs_from:rows] = rows - 1
        valid[outs_from:rows] = 0
        reset[outs_from:rows] = 0

    def pack(self, bs: int, pieces: list[PrefillPiece], spans: list[tuple[int, int]], rows: int) -> None:
        """Host: ``bs`` decode rows (their tokens and slots copied in on the device by :meth:`load`),
        then each piece's rows at ``spans`` (start, end), padded up to ``rows``."""
        slot, piece_pos, is_decode, last, valid, reset = self.host_meta
        is_decode[:bs] = 1
        last[:bs] = np.arange(bs)
        valid[:bs] = 1
        reset[:bs] = 0
        r = bs
        for o, (piece, (start, end)) in enumerate(zip(pieces, spans, strict=True), start=bs):
            n = end - start
            self.host_tok[r:r + n] = np.asarray(piece.tokens.cpu(), dtype=np.int64).T
            slot[r:r + n] = piece.slot
            piece_pos[r:r + n] = np.arange(start, end)
            is_decode[r:r + n] = 0
            last[o], valid[o], reset[o] = r + n - 1, 1, int(start == 0)
            r += n
        self.pack_pads(r, bs + len(pieces), rows)

    def load(self, frame: Tensor, slots: Tensor) -> None:
        """The host array in (one copy), then the decode rows' frames and slots on the device."""
        self.device.copy_(torch.from_numpy(self.host), non_blocking=True)
        bs = int(frame.shape[0])
        self.tok[:bs].copy_(frame)
        self.field("slot")[:bs].copy_(slots)


def mixed_step_body(graphs: PrefillGraphs, inputs: MixedStepInputs, rows: int) -> None:
    """What one mixed-step graph captures, on the first ``rows`` rows: embed, the attending pass, and
    every output's logits, hand-off state, length and sampling counter."""
    model, cache = graphs.model, graphs.cache
    slot, piece_pos, is_decode, last, valid, reset = (inputs.field(f)[:rows] for f in FIELDS)
    pos = torch.where(is_decode.bool(), cache.lengths[slot].clamp(max=cache.max_seq_len - 1), piece_pos)
    graphs.x[:rows].copy_(model.embed(inputs.tok[:rows].t()[None])[0])
    graphs.pos[:rows].copy_(pos)
    graphs.slots[:rows].copy_(slot)
    torch.add(pos, 1, out=graphs.att_len[:rows])
    graphs.attending_pass(rows)
    h, normed = graphs.x[:rows][last], graphs.normed[:rows][last]
    real = valid.bool()
    out = torch.where(real, slot[last], inputs.scratch)
    cache.pending_logits[out] = model.main_logits(normed)
    cache.pending_hidden[out] = model.fast_input(h, normed).to(cache.pending_hidden.dtype)
    cache.lengths[out] = torch.where(real, pos[last] + 1, cache.lengths[out])
    cache.steps[out] = torch.where(reset.bool(), 0, cache.steps[out])

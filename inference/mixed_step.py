"""Mixed steps: a decode step's slow half and the iteration's prefill pieces in one pass of the slow model.

Why: on an H100 at c=64 the engine's stream spends ~10.4 ms a step decoding and ~4.4 ms prefilling
(short prompts, ~44 prompt tokens a step; byte prompts: 11.2 + 5.3 ms), each a separate pass
through the 36 slow layers, and each reads all of their FP8 weights (~3.6 GB; the decode step's
GEMMs are weight-bound at 64 rows, 2026-12-06f call 20, 2026-12-06d). With the pieces' rows riding
in the decode step's pass, the weights are read once for both and the GEMMs run at 64 + ~44 rows,
which on a weight-bound GEMM costs little more than 64 (what continuous-batching servers call
mixed or chunked-prefill batches). What it costs: the step's slow half no longer replays from the
whole-step graph but from the prefill's piecewise graphs (attention eager between segments, ~36
attention launches of host time), and a request prefilled in a mixed step decodes its first frame
in the next step rather than in the same iteration.

Measured (H100, 2026-12-06g, ``next_calls.sh 25c`` and its c=64 twin, one round each, short prompts):
the engine's GPU work a step 14.7 -> 12.8 ms at c=64 and 22.8 -> 19.0 at c=128, as built for; but the
host's launch phase 1.1 -> 6.0 and 1.4 -> 9.5 ms a step (this module's eager split attention, 36 a
step, between the segment replays), so the engine thread sets the pace: frames/s -1.4 % at c=64, +2.7 %
at c=128, first audio p99 225 -> 176 and 501 -> 301 ms. Since then, with mixed steps on, the engine
captures the prefill's segments a second time with every row's attention inside
(:meth:`~ttsfleet.inference.prefill_graphs.PrefillGraphs.run_attending`: decode attention for every row,
a prompt row over its own slot's keys up to its position, which is its causal attention), so the pass
is the segments' replays alone. Measured so (H100, 2026-12-06h, ``next_calls.sh 25`` and ``25s``: two
rounds side by side on one machine, short prompts): frames/s 4,058 -> 4,588 and 3,917 -> 4,574 at
c=64 (+13 %, +17 %), 4,617 -> 5,685 and 4,768 -> 5,658 at c=128 (+23 %, +19 %), first audio p50 down
at both levels, p99 down at c=64 (299 -> 206, 315 -> 219 ms), at c=128 once up and once down. **On by
default** since; ``TTSFLEET_MIXED_STEPS=off`` gives the separate prefill calls back. Since 2026-12-07
the attending segments are one graph per bucket (one replay a step), and ``TTSFLEET_MIXED_GRAPH=step``
(:mod:`.mixed_graphs`, opt-in: measured slower served) puts the set-up and hand-off in it too.

The pass: rows ``[decode rows ; piece rows]`` (each decode row is its slot's next position, the
frame's embedding; the pieces' rows as :meth:`~ttsfleet.inference.model.DualARModel.prefill_batch`
lays them out), every per-row kernel once over all rows. Attention: from the attending segment
graphs, every row through decode attention over its own slot up to its position; eagerly (no such
graphs, or more rows than their largest bucket), split: the decode rows through decode attention,
the piece rows through the prefill's variable-length attention. Then each decode row's and each
piece's last row's logits and hand-off state.

Ordering (the engine): pieces ride only where something decodes; otherwise, or where the rows
exceed the largest prefill graph bucket, they go in a prefill call as before (on the side stream
where it is on). A mixed step's slow pass uses the prefill graphs' static buffers, so the engine's
stream first waits on the GPU for any side call still in flight; a side call waits for the engine's
queued work already (:mod:`.prefill_stream`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ttsfleet.switches import ProcessSwitch, one_of

from . import fused

if TYPE_CHECKING:
    from .model import DualARModel, KVCache, PrefillPiece
    from .prefill_graphs import PrefillGraphs

MIXED_STEPS_ENV = "TTSFLEET_MIXED_STEPS"
#: ``on`` (default since 2026-12-06h): the engine runs an iteration's prefill pieces inside its decode
#: step when something is decoding (and the rows fit a prefill graph bucket on a GPU); ``off``: separate
#: prefill calls (on the side stream where it is on), the path before.
MIXED_STEPS_SWITCH: ProcessSwitch[bool] = ProcessSwitch(
    MIXED_STEPS_ENV, "on", lambda raw: one_of(MIXED_STEPS_ENV, ("off", "on"), "on")(raw) == "on")


class MixedAttend:
    """Attention for ``[decode rows ; piece rows]``: the first ``decode_rows`` rows attend as a decode
    step's (:class:`~ttsfleet.inference.fused.DecodeAttend`), the rest as the prefill pieces' (their
    layout's ``attend``). Both read the K/V stored for this pass's rows, so either may come first."""

    def __init__(self, decode_rows: int, decode: fused.DecodeAttend, pieces: fused.Attend) -> None:
        self.decode_rows, self.decode, self.pieces = decode_rows, decode, pieces

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, ks: Tensor | None = None,
                 vs: Tensor | None = None) -> Tensor:
        n = self.decode_rows
        return torch.cat([self.decode(q[:n], k, v, ks, vs), self.pieces(q[n:], k, v, ks, vs)])


def mixed_slow_pass(model: DualARModel, cache: KVCache, slots: Tensor, frame: Tensor,
                    pieces: list[PrefillPiece], graphs: PrefillGraphs | None = None) -> None:
    """The fused slow pass of :meth:`~ttsfleet.inference.model.DualARModel.decode_with_prefill`:
    ``frame [bs, 1 + ncb]`` appended to ``slots`` and ``pieces`` prefilled: where the rows fit a bucket,
    from ``graphs``' attending pass with the set-up and hand-off eager (every row over its own slot's
    keys up to its position) or, with ``TTSFLEET_MIXED_GRAPH=step``, from their whole mixed-step graphs
    (:mod:`.mixed_graphs`: set-up, pass and hand-off in one replay); else eagerly with the attention
    split (:class:`MixedAttend`)."""
    if graphs is not None and graphs.mixed_inputs is not None and \
            graphs.run_mixed_step(frame, slots, pieces, model.piece_spans(cache, pieces)):
        return
    bs = int(slots.shape[0])
    lay, tokens = model.piece_rows(cache, pieces)
    pos = cache.lengths[slots].clamp(max=cache.max_seq_len - 1)
    x = torch.cat([model.embed(frame[:, :, None])[:, 0], model.embed(tokens)[0]])
    row_pos, row_slots = torch.cat([pos, lay.pos]), torch.cat([slots, lay.row_slots])
    if graphs is not None and graphs.attending and graphs.bucket(int(x.shape[0])) is not None:
        h, normed = graphs.run_attending(x, row_pos, row_slots)
    else:
        attend = MixedAttend(bs, fused.decode_attend(slots, pos + 1), lay.attend)
        h, normed = fused.run_blocks(list(model.layers), x, model.rope, row_pos, cache.k, cache.v, row_slots,
                                     attend, model.norm, cache.k_scale, cache.v_scale)
    last = torch.cat([torch.arange(bs, device=x.device), bs + lay.last])
    h, normed = h[last], normed[last]
    out_slots = torch.cat([slots, lay.slots])
    cache.pending_logits[out_slots] = model.main_logits(normed)
    cache.pending_hidden[out_slots] = model.fast_input(h, normed).to(cache.pending_hidden.dtype)
    cache.lengths[slots] = pos + 1
    model.land_pieces(cache, lay)

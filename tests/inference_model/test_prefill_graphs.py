"""The prefill's piecewise graphs (:mod:`ttsfleet.inference.prefill_graphs`) against the plain fused prefill.

On CPU the segments run eagerly through Triton's interpreter on the same padded static buffers as
the graphs would (the padding, the scratch slot and the hand-over between segments are what is
checked); on CUDA they are captured and replayed.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.inference.loader import load_model  # noqa: E402
from ttsfleet.inference.model import PrefillPiece  # noqa: E402
from ttsfleet.inference.prefill_graphs import FRESH, PrefillGraphs, row_buckets  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


pytestmark = pytest.mark.usefixtures("fused_kernels")


def test_row_buckets_cover_every_count_within_a_quarter() -> None:
    buckets = row_buckets(2048)
    assert buckets[0] == 64 and buckets[-1] == 2048 and buckets == sorted(set(buckets))
    assert all(b % 4 == 0 for b in buckets)
    assert all(hi <= 1.25 * lo for lo, hi in zip(buckets[8:], buckets[9:], strict=False))
    assert row_buckets(1000)[-1] == 1000 and row_buckets(30) == [32]
    with pytest.raises(ValueError, match="multiple of 4"):
        row_buckets(512, min_rows=6)


def _pieces(cfg, lengths: list[int], starts: list[int], seed: int) -> list[PrefillPiece]:  # noqa: ANN001
    g = torch.Generator().manual_seed(seed)
    out = []
    for slot, (t, s) in enumerate(zip(lengths, starts, strict=True)):
        ids = torch.randint(0, 400, (1, t), generator=g)
        codes = torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, t), generator=g)
        out.append(PrefillPiece(slot, torch.cat([ids, codes]).to(DEV), s))
    return out


def _prefill_both(model, pieces: list[PrefillPiece], graphs: PrefillGraphs, eager, padded) -> None:  # noqa: ANN001
    for cache, g in ((eager, None), (padded, graphs)):
        for p in pieces:  # a continuing piece's earlier positions, written the plain way in both
            if p.start:
                model.prefill(cache, p.slot, torch.flip(p.tokens, [1])[:, :p.start], start=0)
        model.prefill_batch(cache, pieces, graphs=g)


def test_padded_segments_leave_the_slots_as_the_plain_fused_prefill() -> None:
    """Two calls of different row counts (one fresh piece, one continuing after cached positions) pad
    into buckets; each slot ends with the plain path's K/V, logits and hand-off state, and the
    padded rows wrote only the scratch slot."""
    model = load_model("tiny", device=DEV, dtype=torch.float32, quantize="bsgemm_fp8")  # the H200's path
    eager, padded = model.new_cache(4, 96), model.new_cache(4, 96)
    scratch = 3
    graphs = PrefillGraphs(model, padded, scratch, [8, 16, 24])
    if DEV == "cuda":
        graphs.capture()
    for lengths, starts, seed in (([5, 7], [0, 3], 1), ([9, 2, 6], [0, 0, 4], 2)):
        pieces = _pieces(model.config, lengths, starts, seed)
        _prefill_both(model, pieces, graphs, eager, padded)
        for p in pieces:
            end = p.start + p.tokens.shape[1]
            assert padded.length(p.slot) == end
            for name in ("k", "v"):
                torch.testing.assert_close(getattr(padded, name)[:, p.slot, :end],
                                           getattr(eager, name)[:, p.slot, :end], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(padded.pending_logits[p.slot], eager.pending_logits[p.slot],
                                       rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(padded.pending_hidden[p.slot], eager.pending_hidden[p.slot],
                                       rtol=1e-4, atol=1e-5)
            # nothing past the piece: the padded rows stored into the scratch slot only
            assert torch.equal(padded.k[:, p.slot, end:], eager.k[:, p.slot, end:])
    assert padded.length(scratch) == 0  # K/V of padded rows land there; the slot is never "held"


def test_rows_beyond_the_largest_bucket_are_refused_and_prefill_falls_back() -> None:
    model = load_model("tiny", device=DEV, dtype=torch.float32)
    cache = model.new_cache(3, 64)
    graphs = PrefillGraphs(model, cache, 2, [8])
    assert graphs.bucket(8) == 8 and graphs.bucket(9) is None
    pieces = _pieces(model.config, [10], [0], 3)
    with pytest.raises(ValueError, match="largest row bucket 8"):
        graphs.run(torch.zeros(10, model.config.dim, device=DEV), torch.zeros(10, dtype=torch.int64),
                   torch.zeros(10, dtype=torch.int64), lambda *a: a[0])
    with pytest.raises(ValueError, match="largest row bucket 8"):  # the same check for mixed steps' pass
        graphs.run_attending(torch.zeros(10, model.config.dim, device=DEV),
                             torch.zeros(10, dtype=torch.int64), torch.zeros(10, dtype=torch.int64))
    model.prefill_batch(cache, pieces, graphs=graphs)  # 10 rows: the plain fused path
    assert cache.length(0) == 10
    with pytest.raises(ValueError, match="scratch slot 3"):
        PrefillGraphs(model, cache, 3, [8])


@pytest.mark.parametrize("kv_dtype", ["auto", "fp8"])
def test_a_whole_call_leaves_the_slot_as_the_plain_fused_prefill(kv_dtype: str) -> None:
    """One-piece calls through the whole-call path (attention inside): fresh pieces causal over their
    own rows, continuing ones over keys padded to a static length and masked (within the smallest key
    length and past it); each slot ends with the plain path's K/V, logits and hand-off state, the
    padded rows in the scratch slot only."""
    model = load_model("tiny", device=DEV, dtype=torch.float32, quantize="bsgemm_fp8")
    eager, padded = model.new_cache(4, 96, kv_dtype=kv_dtype), model.new_cache(4, 96, kv_dtype=kv_dtype)
    scratch = 3
    graphs = PrefillGraphs(model, padded, scratch, [8, 16, 24], whole=True, keys=[16, 96])
    assert graphs.whole_fit(5, 5) == (8, FRESH) and graphs.whole_fit(13, 13) == (16, FRESH)
    assert graphs.whole_fit(5, 9) == (8, 16) and graphs.whole_fit(9, 20) == (16, 96)
    assert graphs.whole_fit(25, 25) is None and graphs.whole_fit(5, 97) is None
    if DEV == "cuda":
        graphs.capture()
        assert sorted(graphs.whole_graphs) == [(8, FRESH), (8, 16), (8, 96), (16, FRESH), (16, 16), (16, 96),
                                               (24, FRESH), (24, 96)]
    used = []
    real_whole = graphs._whole
    graphs._whole = lambda rows, keys: (used.append((rows, keys)), real_whole(rows, keys))[1]
    for length, start, slot, seed in ((5, 0, 0, 4), (7, 12, 1, 5), (13, 0, 2, 6), (4, 5, 0, 7)):
        piece = _pieces(model.config, [length], [start], seed)[0]
        piece.slot = slot
        _prefill_both(model, [piece], graphs, eager, padded)
        end = start + length
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(padded, name)[:, slot, :end].float(),
                                       getattr(eager, name)[:, slot, :end].float(), rtol=1e-4, atol=1e-5)
            assert torch.equal(getattr(padded, name)[:, slot, end:], getattr(eager, name)[:, slot, end:])
        torch.testing.assert_close(padded.pending_logits[slot], eager.pending_logits[slot], rtol=1e-4,
                                   atol=1e-4)
        torch.testing.assert_close(padded.pending_hidden[slot], eager.pending_hidden[slot], rtol=1e-4,
                                   atol=1e-5)
    if DEV == "cpu":  # eager here: the whole path ran at the fits above (on CUDA, their graphs)
        assert used == [(8, FRESH), (8, 96), (16, FRESH), (8, 16)]
    assert padded.length(scratch) == 0


def test_calls_a_whole_graph_cannot_take_use_the_segments() -> None:
    """Two pieces in one call, or whole graphs off: the piecewise path, the same result."""
    model = load_model("tiny", device=DEV, dtype=torch.float32, quantize="bsgemm_fp8")
    eager, padded = model.new_cache(4, 96), model.new_cache(4, 96)
    graphs = PrefillGraphs(model, padded, 3, [8, 16, 24], whole=True, keys=[96])
    off = PrefillGraphs(model, padded, 3, [8, 16, 24], whole=False)
    assert off.whole_fit(5, 5) is None
    chunked = PrefillGraphs(model, padded, 3, [8, 16, 24], whole=True, keys=[96], whole_max_rows=16)
    assert chunked.whole_fit(16, 16) == (16, FRESH)  # up to the engine's chunk
    assert chunked.whole_fit(17, 17) is None
    calls = []
    graphs._whole = lambda rows, keys: calls.append((rows, keys))
    pieces = _pieces(model.config, [5, 7], [0, 0], 7)
    _prefill_both(model, pieces, graphs, eager, padded)
    assert calls == []
    for p in pieces:
        torch.testing.assert_close(padded.pending_logits[p.slot], eager.pending_logits[p.slot], rtol=1e-4,
                                   atol=1e-4)

"""Mixed steps (:mod:`ttsfleet.inference.mixed_step`): a decode step's slow half and prefill pieces in
one pass leave the cache as the decode step and the prefill call do one after the other.

On CPU the fused path runs through Triton's interpreter (the prefill graphs' segments eagerly on their
padded buffers); on CUDA the graphs are captured. What can fail: a decode row attending to the wrong
keys or storing at the wrong position, a piece's rows mixed with the decode rows' (the split
attention), the logits or hand-off state written to the wrong slot, a length or sampling counter
left wrong.
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ttsfleet.inference.loader import load_model  # noqa: E402
from ttsfleet.inference.mixed_graphs import MIXED_GRAPH_SWITCH  # noqa: E402
from ttsfleet.inference.mixed_step import MIXED_STEPS_SWITCH, MixedAttend  # noqa: E402
from ttsfleet.inference.model import PrefillPiece  # noqa: E402
from ttsfleet.inference.prefill_graphs import PrefillGraphs  # noqa: E402
from ttsfleet.inference.sampling import SamplingBatch, SamplingParams  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
DECODING, SCRATCH = (0, 1, 2), 5


pytestmark = pytest.mark.usefixtures("fused_kernels")


def _tokens(cfg, t: int, seed: int) -> torch.Tensor:  # noqa: ANN001
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 400, (1, t), generator=g)
    return torch.cat([ids, torch.randint(0, cfg.codebook_size, (cfg.num_codebooks, t), generator=g)]).to(DEV)


def _start(model, kv_dtype: str):  # noqa: ANN001, ANN202
    """A cache with three decoding slots (prompts of different lengths, one frame decoded) and slot 3
    holding the first half of a prompt whose next chunk is prefilled beside the step."""
    cache = model.new_cache(6, 64, kv_dtype=kv_dtype)
    for slot, t in zip(DECODING, (5, 9, 7), strict=True):
        model.prefill(cache, slot, _tokens(model.config, t, slot), start=0)
    model.prefill(cache, 3, _tokens(model.config, 6, 3), start=0)
    return cache


def _pieces(cfg) -> list[PrefillPiece]:  # noqa: ANN001
    return [PrefillPiece(3, _tokens(cfg, 4, 10), 6), PrefillPiece(4, _tokens(cfg, 7, 11), 0)]


def _sampling() -> SamplingBatch:
    return SamplingBatch.from_params([SamplingParams(seed=s) for s in (7, 8, 9)], DEV)


#: kv_dtype -> (the start cache, the two steps' frames, the cache after them) of the reference side
_APART: dict[str, tuple] = {}


def _apart(model, kv_dtype: str) -> tuple:  # noqa: ANN001
    """The reference side — two plain decode steps, each followed by the prefill call of the same
    pieces — from a fresh copy of :func:`_start`'s cache: (that start cache, the frames of the two
    steps, the cache after them). It is the same computation for every graph mode of one cache dtype
    (the graphs only run on the mixed side; nothing here reads the graph switch, and the tiny model's
    weights come from a fixed seed): run once per dtype, the start cache handed out as a copy."""
    if kv_dtype not in _APART:
        start = _start(model, kv_dtype)
        apart = copy.deepcopy(start)
        slots = torch.tensor(DECODING, device=DEV)
        frames = []
        for _ in range(2):
            frames.append(model.decode_step(apart, slots, _sampling()))
            model.prefill_batch(apart, _pieces(model.config))
            # the same pieces again next time round: slot 3 continues, slot 4 starts over
            apart.lengths[3] = 6
        _APART[kv_dtype] = (start, frames, apart)
    start, frames, apart = _APART[kv_dtype]
    return copy.deepcopy(start), frames, apart


@pytest.fixture
def mixed_graph():  # noqa: ANN201
    """Sets TTSFLEET_MIXED_GRAPH for the test (``step`` or ``pass``), then forgets it."""
    yield MIXED_GRAPH_SWITCH.set
    MIXED_GRAPH_SWITCH.reset()


def _record_rows(pg: PrefillGraphs, graph: str) -> list[int]:
    """The rows of every call into the prefill graphs' mixed path (``graph``: which one)."""
    ran: list[int] = []
    if graph == "step":
        real_step = pg.run_mixed_step

        def step(frame, slots, pieces, spans):  # noqa: ANN001, ANN202
            ran.append(frame.shape[0] + sum(end - start for start, end in spans))
            return real_step(frame, slots, pieces, spans)

        pg.run_mixed_step = step  # type: ignore[method-assign]
    else:
        real_pass = pg.run_attending
        pg.run_attending = lambda *a: (ran.append(a[0].shape[0]), real_pass(*a))[1]  # type: ignore[method-assign]
    return ran


# three of the six pairs (each ~25 s in Triton's interpreter on a CI core): the prefill graphs' attending
# pass alone (the default) and the whole mixed step in one (TTSFLEET_MIXED_GRAPH=step: set-up, pass and
# hand-off) on the model's cache dtype, the eager pass (attention split between decode
# attention and the pieces' SDPA) on an FP8 cache
@pytest.mark.parametrize(("kv_dtype", "graph"), [("auto", "step"), ("auto", "pass"), ("fp8", None)],
                         ids=["graphs-step", "graphs-pass", "fp8-eager"])
def test_a_mixed_step_leaves_the_cache_as_the_step_then_the_prefill_call(kv_dtype: str, graph: str | None,
                                                                          mixed_graph) -> None:  # noqa: ANN001
    model = load_model("tiny", device=DEV, dtype=torch.float32, quantize="bsgemm_fp8")
    # the same prompts in both (prefilled once: the interpreter is slow); the reference side's steps
    # are run once per cache dtype (``_apart``), the mixed side's below in every case
    mixed, frames_apart, apart = _apart(model, kv_dtype)
    slots = torch.tensor(DECODING, device=DEV)
    pg = None
    if graph:
        mixed_graph(graph)
        pg = PrefillGraphs(model, mixed, SCRATCH, [8, 16, 24], attending=True)
        assert (pg.mixed_inputs is not None) == (graph == "step")
        if DEV == "cuda":
            pg.capture()
            captured = pg.mixed_step_graphs if graph == "step" else pg.attending_graphs
            assert sorted(captured) == [8, 16, 24]
        ran = _record_rows(pg, graph)
    # the second step starts from the first's pending logits: it must sample the same
    for frame_apart in frames_apart:
        frame_mixed = model.decode_front(mixed, slots, _sampling())
        assert torch.equal(frame_mixed, frame_apart)
        model.decode_with_prefill(mixed, slots, frame_mixed, _pieces(model.config), graphs=pg)
        mixed.lengths[3] = 6  # as on the reference side: slot 3 continues, slot 4 starts over
    held = {0: 7, 1: 11, 2: 9, 3: 6, 4: 7}
    for slot, n in held.items():
        assert mixed.length(slot) == apart.length(slot) == n
        for name in ("k", "v"):
            torch.testing.assert_close(getattr(mixed, name)[:, slot, :n].float(),
                                       getattr(apart, name)[:, slot, :n].float(), rtol=1e-4, atol=1e-4)
        for name in ("pending_logits", "pending_hidden"):
            torch.testing.assert_close(getattr(mixed, name)[slot], getattr(apart, name)[slot], rtol=1e-4,
                                       atol=1e-4)
    assert torch.equal(mixed.steps[:5], apart.steps[:5])
    assert mixed.steps[4] == 0 and mixed.steps[0] == 2
    if graph:  # 3 decode rows + 4 + 7 prompt rows, padded to the 16-row bucket
        assert ran == [14, 14]


def test_the_split_attention_keeps_each_side_to_its_own_rows() -> None:
    seen = []

    def side(name: str):  # noqa: ANN202
        def attend(q, k, v, ks=None, vs=None):  # noqa: ANN001, ANN202
            seen.append((name, q.shape[0]))
            return q + (1 if name == "decode" else 2)
        return attend

    q = torch.zeros(5, 2, 4)
    out = MixedAttend(2, side("decode"), side("pieces"))(q, None, None)
    assert seen == [("decode", 2), ("pieces", 3)]
    assert out[:2].eq(1).all() and out[2:].eq(2).all()


def test_a_mixed_step_needs_a_piece_and_the_switch_parses() -> None:
    model = load_model("tiny", device=DEV, dtype=torch.float32)
    cache = model.new_cache(2, 16)
    with pytest.raises(ValueError, match="at least one prefill piece"):
        model.decode_with_prefill(cache, torch.tensor([0]), torch.zeros(1, 11, dtype=torch.int64), [])
    MIXED_STEPS_SWITCH.set("off")
    try:
        assert MIXED_STEPS_SWITCH.get() is False
    finally:
        MIXED_STEPS_SWITCH.reset()
    assert MIXED_STEPS_SWITCH.get() is True  # on by default since 2026-12-06h

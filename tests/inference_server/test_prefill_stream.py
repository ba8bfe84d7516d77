"""Prefill on a stream of its own (``TTSFLEET_PREFILL_STREAM``): each call's requests land once the
call is done, and every request gets the codes it gets with the prefill inline — on the CPU (where
a call is done when it returns, and a completion that is late on purpose shows the deferral) and on
a GPU (the side stream itself). Mixed steps are off here: with them on, pieces ride in the decode
step wherever something decodes, and side calls are made only where nothing does."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prefill_stream import (
    PREFILL_JOIN_SWITCH,
    PREFILL_STREAM_SWITCH,
    Done,
    SidePrefill,
    side_stream_wanted,
)
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.tokenizer import load_tokenizer

from .conftest import stream_outputs

SEEDS = [21, 22, 23, 24, 25]
pytestmark = pytest.mark.usefixtures("separate_prefill_calls")  # the calls themselves, not riders


def _codes(device: str, prefill_stream: bool, late: int = 0, **cfg) -> tuple[Engine, list[np.ndarray]]:  # noqa: ANN003
    """Each seed's codes through an engine (tiny model, no codec) whose prefill calls run on the side
    stream or inline; ``late``: the side calls' completions report not done for that many polls."""
    model, tok = load_model("tiny", device=device), load_tokenizer("tiny")
    prompt = build_prompt(tok, model.config, "Prefill on a stream of its own.")
    eng = Engine(model, None, EngineConfig(max_running_requests=3, max_queue=8, cuda_graph_max_bs=3,
                                           device=device, prefill_stream=prefill_stream, **cfg), None, "tiny")
    if late:
        eng._side_prefill = _LateSide(eng._side_prefill, late)
    eng.start()
    try:
        return eng, stream_outputs(eng, prompt, SEEDS, 10, "codes", first_chunk_frames=1, chunk_frames=4)
    finally:
        eng.stop()


class _Late:
    """A completion done only after ``polls`` queries (or a wait): a slow GPU call, on the CPU."""

    def __init__(self, polls: int, log: list[str]) -> None:
        self.left, self.log = polls, log

    def query(self) -> bool:
        self.left -= 1
        self.log.append("query")
        return self.left < 0

    def synchronize(self) -> None:
        self.log.append("wait")
        self.left = -1


class _LateSide:
    """The engine's :class:`SidePrefill`, its completions made late (the call itself runs as usual)."""

    def __init__(self, side: SidePrefill, polls: int) -> None:
        self.side, self.polls, self.log = side, polls, []
        self.joins_next_step = side.joins_next_step

    def run(self, call) -> _Late:  # noqa: ANN001
        assert isinstance(self.side.run(call), Done)
        return _Late(self.polls, self.log)

    def order_after(self, done: _Late) -> None:
        """What the engine's stream would wait for on a GPU; here the call's work is done already."""
        assert isinstance(done, _Late) and done.left >= 0  # only calls not yet done are ordered after
        self.log.append("order")


@pytest.mark.parametrize("chunk", [0, 8])
def test_side_stream_prefill_gives_every_request_its_inline_codes(chunk: int) -> None:
    """Whole prompts, and prompts in 8-token chunks (each next chunk planned once the last landed)."""
    cfg = {"prefill_chunk_tokens": chunk, "prefill_token_budget": 16 if chunk else 2048}
    inline_eng, inline = _codes("cpu", False, **cfg)
    side_eng, side = _codes("cpu", True, **cfg)
    for a, b in zip(inline, side, strict=True):
        assert np.array_equal(a, b)
    assert inline_eng._side_prefill is None and side_eng._side_prefill is not None
    assert side_eng.stats.prefill_chunks == inline_eng.stats.prefill_chunks
    assert side_eng.stats.prefill_tokens == inline_eng.stats.prefill_tokens
    assert not side_eng._prefills and len(side_eng.free_slots) == 3 and not side_eng.prefilling


def test_requests_join_only_once_their_call_is_done() -> None:
    """Completions late by three polls, one prompt a call (a 1-token budget): while others decode the
    loop polls and goes on; with nothing decoding it waits for the call instead of spinning. The
    codes are the inline ones all the same."""
    cfg = {"prefill_chunk_tokens": 0, "prefill_token_budget": 1}
    _, inline = _codes("cpu", False, **cfg)
    eng, late = _codes("cpu", True, late=3, **cfg)
    for a, b in zip(inline, late, strict=True):
        assert np.array_equal(a, b)
    log = eng._side_prefill.log
    assert log.count("query") > log.count("wait") >= 1  # the first call: nothing decoded yet
    assert "query" in log[log.index("wait") + 1:]  # later calls polled while the batch decoded
    assert "order" not in log


def test_joining_at_the_next_step_lands_every_call_at_once_ordered_after_it() -> None:
    """``TTSFLEET_PREFILL_JOIN=next-step``: a call not yet done lands at the next iteration all the
    same, the engine's stream ordered after it (on a GPU, a wait on its event), never a host wait nor
    a second poll; the codes are the inline ones."""
    cfg = {"prefill_chunk_tokens": 0, "prefill_token_budget": 1}
    _, inline = _codes("cpu", False, **cfg)
    try:
        PREFILL_JOIN_SWITCH.set("next-step")
        eng, late = _codes("cpu", True, late=3, **cfg)
    finally:
        PREFILL_JOIN_SWITCH.reset()
    for a, b in zip(inline, late, strict=True):
        assert np.array_equal(a, b)
    log = eng._side_prefill.log
    assert "wait" not in log and log.count("order") == log.count("query") == len(SEEDS)
    assert eng.stats.prefill_calls == len(SEEDS)


def test_the_process_switch_decides_when_the_config_does_not() -> None:
    model = load_model("tiny")
    try:
        PREFILL_STREAM_SWITCH.set("on")
        assert Engine(model, None, EngineConfig(max_running_requests=2))._side_prefill is not None
        off = EngineConfig(max_running_requests=2, prefill_stream=False)
        assert Engine(model, None, off)._side_prefill is None
        PREFILL_STREAM_SWITCH.set("off")
        assert Engine(model, None, EngineConfig(max_running_requests=2))._side_prefill is None
        PREFILL_STREAM_SWITCH.set("auto")  # the default: on with a CUDA device only
        assert Engine(model, None, EngineConfig(max_running_requests=2))._side_prefill is None
        assert side_stream_wanted("cuda") and not side_stream_wanted("cpu")
        with pytest.raises(ValueError, match="TTSFLEET_PREFILL_STREAM"):
            PREFILL_STREAM_SWITCH.set("sideways")
    finally:
        PREFILL_STREAM_SWITCH.reset()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("join", ["done", "next-step"])
def test_on_a_gpu_the_side_stream_gives_the_inline_codes(join: str) -> None:
    """Decode graphs, prefill graphs and the side stream together: the same codes as inline, the
    requests joining once their call is done or at the next step (the engine's stream waiting)."""
    cfg = {"pad_to_buckets": True, "cuda_graphs": True, "prefill_graphs": True, "prefill_chunk_tokens": 8,
           "prefill_token_budget": 16}
    _, inline = _codes("cuda", False, **cfg)
    try:
        PREFILL_JOIN_SWITCH.set(join)
        eng, side = _codes("cuda", True, **cfg)
    finally:
        PREFILL_JOIN_SWITCH.reset()
    assert eng._side_prefill.stream is not None and eng._side_prefill.joins_next_step == (join == "next-step")
    for a, b in zip(inline, side, strict=True):
        assert np.array_equal(a, b)

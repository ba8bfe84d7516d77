"""Codec gathering (``serve --codec-gather-ms``): the pure rule, the batched codec holding chunks so
more streams share a push (real tiny codec, a clock the test sets), the audio unchanged by it, and
both codec loops waking for codes that fall due."""

from __future__ import annotations

import multiprocessing
import types

import numpy as np
import pytest
import torch
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.codec_batch import BatchedCodec
from ttsfleet.inference.codec_gather import GatherRule, StreamTiming, due, due_at, select, wake_in
from ttsfleet.inference.codec_process import _wait_for_codes
from ttsfleet.inference.engine import Engine, EngineConfig
from ttsfleet.inference.loader import load_model
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.serve_config import ServeConfig
from ttsfleet.inference.tokenizer import load_tokenizer

from ttsfleet.errors import UserError

from .conftest import stream_outputs

FRAME = 0.05
RULE = GatherRule(window_s=0.04, frame_s=FRAME)


def test_without_a_window_waiting_codes_are_due_at_once():
    s = StreamTiming(waiting_since=1.0, started_at=0.0, sent_frames=100)
    assert due(GatherRule(0.0, FRAME), s, now=1.0)
    assert not due(RULE, StreamTiming(), now=5.0)  # nothing waits
    assert wake_in(RULE, [StreamTiming()], now=5.0) is None


@pytest.mark.parametrize(("timing", "why"), [
    (StreamTiming(waiting_since=1.0), "its first audio: time to first audio never waits"),
    (StreamTiming(waiting_since=1.0, started_at=0.0, sent_frames=21), "its listener runs dry at 1.05 s"),
])
def test_codes_that_cannot_wait_are_due_at_once(timing: StreamTiming, why: str):
    assert due(RULE, timing, now=1.0), why
    assert select(RULE, {7: timing}, now=1.0) == [7], why


def test_a_buffered_streams_chunk_waits_for_the_window():
    s = StreamTiming(waiting_since=1.0, started_at=0.0, sent_frames=100)  # 5 s sent, 4 s ahead
    assert due_at(RULE, s) == pytest.approx(1.04)
    assert not due(RULE, s, now=1.02) and due(RULE, s, now=1.04)
    assert wake_in(RULE, [s, StreamTiming()], now=1.01) == pytest.approx(0.03)
    running_low = StreamTiming(waiting_since=1.0, started_at=0.0, sent_frames=21)  # ends at 1.05 s
    assert due_at(RULE, running_low) == pytest.approx(1.05 - RULE.guard_s)
    assert wake_in(RULE, [s, running_low], now=0.99) == pytest.approx(0.01)


def test_an_urgent_stream_does_not_flush_the_others_an_expired_window_does():
    buffered = {1: StreamTiming(waiting_since=1.0, started_at=0.0, sent_frames=100),
                2: StreamTiming(waiting_since=1.01, started_at=0.0, sent_frames=100)}
    first_audio = {3: StreamTiming(waiting_since=1.02)}
    assert select(RULE, buffered, now=1.02) == []
    assert select(RULE, {**buffered, **first_audio}, now=1.02) == [3]  # alone: the others keep gathering
    assert select(RULE, {**buffered, **first_audio}, now=1.04) == [1, 2, 3]  # stream 1's window is over
    assert select(GatherRule(0.0, FRAME), buffered, now=1.0) == [1, 2]  # no window: everything at once


def test_a_last_chunk_waits_like_the_others():
    last = StreamTiming(waiting_since=1.0, started_at=0.0, sent_frames=100)  # its listener has 4 s left
    assert not due(RULE, last, now=1.02) and due(RULE, last, now=1.04)


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="must be >= 0"):
        GatherRule(window_s=-1.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        GatherRule(window_s=0.1, guard_s=-0.01)
    with pytest.raises(UserError, match="codec_gather_ms"):
        ServeConfig.from_env({"TTSFLEET_CODEC_GATHER_MS": "-5"}, checkpoint="tiny")
    assert ServeConfig.from_env({"TTSFLEET_CODEC_GATHER_MS": "25"}, checkpoint="tiny").codec_gather_ms == 25.0


class _Sink:
    """Where a stream's events go (the engine's handle, in the engine)."""

    def __init__(self, rid: int) -> None:
        self.rid, self.events = rid, []

    def post(self, ev) -> None:  # noqa: ANN001
        self.events.append(ev)

    def audio(self) -> np.ndarray:
        return np.concatenate([e.audio for e in self.events if e.kind == "audio"])


@pytest.fixture(scope="module")
def codec():
    torch.set_num_threads(1)
    return load_codec("tiny")


def _codes(codec, n: int, seed: int) -> np.ndarray:  # noqa: ANN001
    return np.random.default_rng(seed).integers(0, 100, (codec.num_codebooks, n))


def _two_streams(codec, gather_s: float) -> tuple[BatchedCodec, list[_Sink], list[float]]:  # noqa: ANN001
    """Two streams, each 8 frames of first audio at t=0; then stream 0's next chunk at t=0 and
    stream 1's at half a window later, with the codec asked to work after each."""
    clock = [0.0]
    counters = types.SimpleNamespace(codec_calls=0, codec_frames=0, codec_s=0.0, codec_rounds=0)
    batched = BatchedCodec(codec.slot_decoder(3), 8, counters, cancel=lambda h: None, gather_s=gather_s,
                           clock=lambda: clock[0])
    sinks = [_Sink(0), _Sink(1)]
    for i, sink in enumerate(sinks):
        batched.add(sink, _codes(codec, 8, i), False, "", 8)
    batched.round()  # first audio: due at once, one push of both streams
    assert counters.codec_calls == 1 and all(s.events for s in sinks)
    batched.add(sinks[0], _codes(codec, 8, 10), False, "", 16)
    batched.round()
    clock[0] = gather_s / 2
    batched.add(sinks[1], _codes(codec, 8, 11), False, "", 16)
    batched.round()
    return batched, sinks, clock


def test_a_held_chunk_shares_its_push_with_the_next_streams_chunk(codec):  # noqa: ANN001
    frame_s = codec.frame_length / codec.sample_rate
    plain, plain_sinks, _ = _two_streams(codec, 0.0)
    assert plain.counters.codec_calls == 3  # each chunk its own push

    window = frame_s  # 8 frames sent, a frame's audio of wait: well inside what the listener has
    held, sinks, clock = _two_streams(codec, window)
    assert held.counters.codec_calls == 1 and not held.has_work()
    assert held.wake_in() == pytest.approx(window / 2)
    clock[0] = window
    assert held.has_work()
    held.round()
    assert held.counters.codec_calls == 2 and held.counters.codec_frames == 32  # one push, both chunks
    assert held.counters.codec_rounds == 2
    for a, b in zip(plain_sinks, sinks, strict=True):  # when it is decoded changes, not what
        np.testing.assert_allclose(b.audio(), a.audio(), rtol=0, atol=1e-4)  # batch shapes round differently
    held.add(sinks[0], _codes(codec, 3, 12), True, "length", 19)  # a last chunk waits like any other
    assert not held.has_work()
    clock[0] += window
    held.round()  # 3 frames drained in one round: a push of 2, then of 1
    assert [e.kind for e in sinks[0].events][-1] == "done" and held.counters.codec_calls == 4
    assert held.counters.codec_rounds == 3
    assert not held.jobs[sinks[1].rid].backlog and not held.has_work()


def test_a_first_audio_goes_alone_while_the_buffered_streams_gather(codec):  # noqa: ANN001
    frame_s = codec.frame_length / codec.sample_rate
    held, sinks, clock = _two_streams(codec, frame_s)  # both streams' second chunks wait
    newcomer = _Sink(2)
    held.add(newcomer, _codes(codec, 2, 20), False, "", 2)
    assert held.has_work()
    held.round()
    assert held.counters.codec_calls == 2 and held.counters.codec_frames == 16 + 2  # the newcomer alone
    assert [e.kind for e in newcomer.events] == ["audio"]
    assert all(held.jobs[s.rid].backlog == 8 for s in sinks)  # still gathering


def test_the_process_loop_waits_for_codes_or_for_the_deadline():
    parent, child = multiprocessing.Pipe()
    assert _wait_for_codes(child, 0.01) == []  # nothing came: the codes already here fall due
    parent.send([("codes", 1)])
    assert _wait_for_codes(child, 5.0) == [("codes", 1)]
    parent.send([("codes", 2)])
    assert _wait_for_codes(child, None) == [("codes", 2)]


def test_the_engine_decodes_the_same_audio_with_gathering(codec):  # noqa: ANN001
    model, tok = load_model("tiny"), load_tokenizer("tiny")
    prompt = build_prompt(tok, model.config, "Gathering test sentence.")

    def run(gather_ms: float) -> list[np.ndarray]:
        eng = Engine(model, codec, EngineConfig(max_running_requests=3, max_queue=8, cuda_graph_max_bs=3,
                                                codec_gather_ms=gather_ms))
        eng.start()
        try:
            return stream_outputs(eng, prompt, [1, 2, 3], 12, "audio", first_chunk_frames=1, chunk_frames=2)
        finally:
            eng.stop()

    for a, b in zip(run(0.0), run(30.0), strict=True):
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-4)  # batch shapes round differently

"""The gather rule at scale (:mod:`ttsfleet.inference.codec_gather_sim`): many streams' chunks arriving
out of step, the real tiny codec deciding and decoding, a clock the test drives. With a window, the
same streams are decoded in fewer rounds and calls, and no listener runs dry — what the first rule of
2026-12-05 failed at: any one stream that could not wait flushed every stream, so at c=64 no window
ever expired."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.inference.codec import load_codec
from ttsfleet.inference.codec_gather_sim import SimConfig, arrivals, simulate

CFG = SimConfig(streams=32, frames=64)


@pytest.fixture(scope="module")
def codec():
    torch.set_num_threads(1)
    return load_codec("tiny")


@pytest.fixture(scope="module")
def runs(codec):  # noqa: ANN001, ANN201
    """``CFG`` simulated without a window and with a 100 ms one, once for the module: a run is
    deterministic (the test's clock, seeded chunks) and the tests below only read its counts."""
    return {window_s: simulate(codec, CFG, window_s) for window_s in (0.0, 0.1)}


def test_the_chunks_ramp_and_stagger_and_every_frame_is_sent_once() -> None:
    chunks = arrivals(CFG)
    assert [t for t, *_ in chunks] == sorted(t for t, *_ in chunks)
    first = [k for _, s, k, _ in chunks if s == 0]
    assert first[:4] == [1, 2, 4, 4] and sum(first) == CFG.frames
    assert sum(k for _, _, k, _ in chunks) == CFG.streams * CFG.frames
    assert sum(last for *_, last in chunks) == CFG.streams  # one last chunk a stream
    starts = sorted(min(t for t, s, *_ in chunks if s == i) for i in range(CFG.streams))
    assert starts[-1] - starts[0] > CFG.frames / CFG.frames_per_s / 2  # out of step, not one wave


def test_a_window_decodes_the_same_streams_in_fewer_rounds_and_calls_and_none_runs_dry(runs):  # noqa: ANN001
    """Deterministic (the clock is the test's): 32 streams x 64 frames, a window of 100 ms against none
    took rounds 133 -> 64 and calls 189 -> 149 on 2026-12-05 (a gathered round still makes one call
    per frame count: 4-frame and 8-frame backlogs side by side); the first rule, every last chunk and
    every stream within two windows of running dry flushing everyone, gave 88 rounds and 172 calls
    here, and fails the calls bound."""
    plain, gathered = runs[0.0], runs[0.1]
    assert plain.frames == gathered.frames == CFG.streams * CFG.frames  # every frame decoded, once
    assert plain.underruns == gathered.underruns == 0
    assert gathered.rounds * 3 <= plain.rounds * 2
    assert gathered.calls * 20 <= plain.calls * 17
    assert gathered.rounds < gathered.calls


def test_a_ragged_push_is_counted_as_one_call_a_round_its_padding_as_frames(codec, runs):  # noqa: ANN001
    """What a push taking each row's own frame count would make of the same rounds: a call a round (more
    only past ``max_frames``), every row computed to the round's longest backlog."""
    for r in runs.values():
        assert r.rounds <= r.ragged_calls < r.calls
        assert r.frames <= r.ragged_frames <= r.frames * CFG.max_frames
    short = simulate(codec, SimConfig(streams=4, frames=24, max_frames=2), 0.1)  # 4-frame chunks, 2 a call
    assert short.ragged_calls > short.rounds

"""The benchmark's listener: audio played from its first byte, gaps counted where the next bytes come
after what arrived has played out."""

from __future__ import annotations

import math

import pytest
from ttsfleet.inference.bench import Sample, summarize_runs
from ttsfleet.inference.bench_playback import MIN_STALL_S, Playback


def _played(reads: list[tuple[float, float]]) -> Playback:
    play = Playback()
    for t, seconds in reads:
        play.feed(t, seconds)
    return play


def test_audio_that_arrives_ahead_of_playback_never_stalls():
    play = _played([(1.0, 0.1), (1.05, 0.4), (1.3, 0.4), (1.31, 0.0)])
    assert play.stalls == 0 and play.stall_s == 0.0 and play.end == pytest.approx(1.9)


def test_a_late_chunk_is_one_underrun_of_its_gap():
    # 46 ms of first audio, then 4 frames 69 ms later: silent from 1.046 to 1.069
    play = _played([(1.0, 0.046), (1.069, 0.186), (1.2, 0.186), (1.6, 0.1)])
    assert play.stalls == 2  # the second at 1.6, after the audio ran out at 1.441
    assert play.stall_s == pytest.approx((1.069 - 1.046) + (1.6 - 1.441))
    assert play.end == pytest.approx(1.7)
    assert play.first_stall_at_s == pytest.approx(0.046)  # the first chunk's audio, then silence


def test_the_first_underrun_is_placed_by_the_audio_played_before_it():
    play = _played([(1.0, 0.1), (1.05, 0.2), (1.45, 0.1)])  # dry at 1.3 after 0.3 s of audio
    assert play.stalls == 1 and play.first_stall_at_s == pytest.approx(0.3)
    assert _played([(1.0, 0.1), (1.05, 0.2)]).first_stall_at_s is None


def test_a_gap_inside_the_read_jitter_is_not_counted():
    play = _played([(1.0, 0.1), (1.1 + MIN_STALL_S / 2, 0.1)])
    assert play.stalls == 0 and play.end == pytest.approx(1.2 + MIN_STALL_S / 2)


def test_a_level_reports_its_stalled_share_and_silence_tail():
    samples = [Sample(True, 200, 0.05, 1.0, 40.0, audio_s=2.0, start_s=float(i), stalls=n, stall_s=0.03 * n)
               for i, n in enumerate([0, 0, 1, 3])]
    samples[2].first_stall_at_s, samples[3].first_stall_at_s = 0.046, 0.5
    level = summarize_runs(4, 4, [(samples, 4.0, None)], closed=False)
    assert level.stalled_share == pytest.approx(0.5)
    assert level.stall_p99_s == pytest.approx(0.09, rel=0.05)
    assert level.first_stall_at_p50_s == pytest.approx((0.046 + 0.5) / 2)  # over the two that stalled
    silent = summarize_runs(1, 1, [([Sample(True, 200, 0.05, 1.0, 40.0)], 1.0, None)], closed=False)
    assert math.isnan(silent.stalled_share)  # no pcm audio: nothing to play, nothing claimed

"""The benchmark's steady window, capacity figure and method guard, on samples whose answer is known."""

from __future__ import annotations

import pytest
from ttsfleet.inference.bench import Sample, capacity, points, summarize_runs
from ttsfleet.inference.bench_engine import regressions
from ttsfleet.inference.bench_window import Window, frames_in, started_in, steady_window


def _client(k: int, starts_ttfa_len: list[tuple[float, float, float]], fps: float = 10.0) -> list[Sample]:
    """Back-to-back requests of client ``k``: (start, ttfa, duration) each, ``fps`` frames/s once audible."""
    return [Sample(True, 200, t, d, fps * (d - t), audio_s=(d - t), start_s=s, client=k, wave=w)
            for w, (s, t, d) in enumerate(starts_ttfa_len)]


def test_window_runs_from_the_last_first_audio_to_the_first_client_leaving():
    a = _client(0, [(0.0, 0.5, 2.0), (2.0, 0.1, 3.0), (5.0, 0.1, 3.0)])  # ends 8.0
    b = _client(1, [(0.0, 1.5, 4.0), (4.0, 0.1, 2.0), (6.0, 0.1, 4.0)])  # first audio 1.5, ends 10.0
    w = steady_window(a + b)
    assert (w.start, w.end) == (1.5, 8.0)
    # 10 frames/s per request between first audio and end: 2 clients x 6.5 s, less the 0.1 s before
    # the first audio of the four requests that start inside the window
    assert frames_in(a + b, w) == pytest.approx(20.0 * w.seconds - 4 * 0.1 * 10.0)
    assert [(s.client, s.wave) for s in started_in(a + b, w)] == [(0, 1), (0, 2), (1, 1), (1, 2)]


def test_no_window_without_a_second_wave():
    one_each = _client(0, [(0.0, 0.5, 2.0)]) + _client(1, [(0.0, 1.0, 1.5)])
    assert steady_window(one_each) is None
    assert steady_window([]) is None


def test_frames_outside_the_window_do_not_count():
    s = _client(0, [(0.0, 1.0, 11.0)])  # 100 frames over 1 .. 11 s
    assert frames_in(s, Window(0.0, 1.0)) == 0.0
    assert frames_in(s, Window(6.0, 11.0)) == pytest.approx(50.0)
    failed = [Sample(False, 500, 0.0, 1.0, 0.0, start_s=0.0)]
    assert frames_in(failed, Window(0.0, 5.0)) == 0.0


def test_a_burst_first_wave_is_reported_apart_from_the_steady_latency():
    """c=2: the first wave waits 1 s for its first audio (the burst), later requests 0.1 s."""
    runs = []
    for _ in range(3):
        a = _client(0, [(0.0, 1.0, 3.0)] + [(3.0 + 2 * i, 0.1, 2.0) for i in range(5)])
        b = _client(1, [(0.0, 1.0, 3.0)] + [(3.0 + 2 * i, 0.1, 2.0) for i in range(5)])
        runs.append((a + b, 13.0, None))
    lv = summarize_runs(2, 12, runs)
    assert lv.method == "steady" and lv.steady_requests == 3 * 10
    assert lv.ttfa_p99_s == pytest.approx(0.1) and lv.first_wave_ttfa_p50_s == pytest.approx(1.0)
    fps_after_first_audio = 2 * 10.0
    assert lv.frames_per_s == pytest.approx(fps_after_first_audio, rel=0.06)  # gaps at each request start
    assert lv.whole_run_frames_per_s < lv.frames_per_s  # the whole run counts the burst's wait
    assert lv.frames_per_s_spread == pytest.approx(0.0)


def test_single_wave_levels_stay_whole_run():
    lv = summarize_runs(2, 2, [(_client(0, [(0.0, 0.5, 2.0)]) + _client(1, [(0.0, 0.5, 2.0)]), 2.0, None)])
    assert lv.method == "whole-run" and lv.steady_requests == 0
    assert lv.frames_per_s == pytest.approx(lv.whole_run_frames_per_s)


def _level(c: int, rtf99: float, ttfa99: float, errors: int = 0):  # noqa: ANN202
    """A level of ``c`` clients whose SLO figures are set to the given ones."""
    three = [(0.0, 0.05, 1.0), (1.0, 0.05, 1.0), (2.0, 0.05, 1.0)]
    lv = summarize_runs(c, 3 * c, [([s for k in range(c) for s in _client(k, three)], 3.0, None)])
    lv.rtf_p99, lv.ttfa_p99_s, lv.errors = rtf99, ttfa99, errors
    return lv


def test_capacity_is_the_largest_level_meeting_both_slo_bounds():
    levels = [_level(1, 0.1, 0.05), _level(8, 0.3, 0.2), _level(16, 0.45, 0.3), _level(32, 0.6, 0.2)]
    cap = capacity(levels)
    assert cap["concurrency"] == 8 and cap["levels_meeting_slo"] == [1, 8]
    assert capacity(levels, ttfa_p99_s=0.5)["concurrency"] == 16
    assert capacity([_level(4, 0.1, 0.1, errors=1)])["concurrency"] == 0, "a level with errors never counts"
    assert all(p["method"] == "steady" for p in points(levels))


def test_the_gate_refuses_to_compare_different_methods():
    base = {"points": [{"concurrency": 4, "frames_per_s": 100.0}],
            "levels": [{"concurrency": 4, "repeats": 3, "frames_per_s_spread": 0.02}]}
    same = {"points": [{"concurrency": 4, "frames_per_s": 99.0}]}
    steady = {"points": [{"concurrency": 4, "frames_per_s": 120.0, "method": "steady"}]}
    assert regressions(base, same) == []
    out = regressions(base, steady)
    assert len(out) == 1 and "not comparable" in out[0]

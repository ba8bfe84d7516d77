"""The codec's work as counters: :class:`~ttsfleet.inference.codec_batch.CodecMeter` turns both codec
modes' counts into counter increments, and ``bench serve`` reads them per level from two /metrics
snapshots (the servers' own export is tested in test_metrics_prometheus, test_engine and
test_codec_process)."""

from __future__ import annotations

import types

import pytest
from prometheus_client.parser import text_string_to_metric_families
from ttsfleet.inference.bench import codec_line, codec_totals, codec_use, print_table
from ttsfleet.inference.bench_steady import Counts
from ttsfleet.inference.codec_batch import CodecMeter


def _meter() -> tuple[CodecMeter, types.SimpleNamespace, list[tuple[str, float]]]:
    stats = types.SimpleNamespace(codec_calls=0, codec_frames=0, codec_s=0.0, codec_rounds=0)
    exported: list[tuple[str, float]] = []
    return CodecMeter(stats, lambda metric, amount: exported.append((metric, amount))), stats, exported


def test_the_codec_threads_additions_are_exported_as_they_happen():
    meter, stats, exported = _meter()
    meter.codec_calls += 1
    meter.codec_frames += 16
    meter.codec_s += 0.25
    meter.codec_rounds += 1
    assert (stats.codec_calls, stats.codec_frames, stats.codec_s, stats.codec_rounds) == (1, 16, 0.25, 1)
    assert exported == [("inference_codec_pushes", 1), ("inference_codec_frames", 16),
                        ("inference_codec_busy_seconds", 0.25), ("inference_codec_rounds", 1)]


def test_the_codec_process_totals_are_exported_as_their_growth():
    """The child sends running totals: each is assigned, and only what it grew by is exported (an
    unchanged total exports nothing; a counter never goes back)."""
    meter, stats, exported = _meter()
    for totals in ((2, 8, 0.5), (2, 8, 0.5), (5, 20, 0.75)):
        meter.codec_calls, meter.codec_frames, meter.codec_s = totals
    assert (stats.codec_calls, stats.codec_frames, stats.codec_s) == (5, 20, 0.75)
    got: dict[str, float] = {}
    for metric, amount in exported:
        assert amount > 0
        got[metric] = got.get(metric, 0) + amount
    assert got == {"inference_codec_pushes": 5, "inference_codec_frames": 20,
                   "inference_codec_busy_seconds": 0.75}
    assert len(exported) == 6  # the repeated totals exported nothing


def _samples(pushes: float, frames: float, busy: float, rounds: float | None = None) -> list:
    lines = [f'ttsfleet_inference_codec_pushes_total{{model="tiny"}} {pushes}',
             f'ttsfleet_inference_codec_frames_total{{model="tiny"}} {frames}',
             f'ttsfleet_inference_codec_busy_seconds_total{{model="tiny"}} {busy}',
             'ttsfleet_inference_frames_total{model="tiny"} 999']
    if rounds is not None:  # a server from before the rounds counter exports none
        lines.append(f'ttsfleet_inference_codec_rounds_total{{model="tiny"}} {rounds}')
    text = "\n".join(lines) + "\n"
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_a_levels_codec_use_from_two_snapshots():
    before, after = _samples(10, 40, 1.0), _samples(110, 440, 4.0)
    assert codec_totals(before) == {"pushes": 10, "frames": 40, "busy_s": 1.0}
    use = codec_use(Counts.between(before, after, 5.0).codec, wall_s=5.0)
    assert use == {"pushes": 100, "frames_per_push": 4.0, "busy_share": pytest.approx(0.6)}
    assert codec_line({"concurrency": 64, **use}) == (
        "c=64 codec: 100 pushes, 4.0 frames per push, busy 60% of the level's wall time")


def test_a_levels_rounds_say_how_many_frames_each_gathered():
    before, after = _samples(10, 40, 1.0, rounds=5), _samples(110, 440, 4.0, rounds=25)
    use = codec_use(Counts.between(before, after, 5.0).codec, wall_s=5.0)
    assert use["rounds"] == 20 and use["frames_per_round"] == 20.0
    assert codec_line({"concurrency": 64, **use}, "the steady window") == (
        "c=64 codec: 100 pushes, 4.0 frames per push in 20 rounds (20.0 frames a round), busy 60% of "
        "the steady window")


def test_a_server_without_codec_counters_gives_no_codec_line(capsys):
    """An older server exports none: no reading, no report entry, no line, no crash; nor a level in
    which the codec pushed nothing."""
    old = [s for s in _samples(1, 1, 1) if "codec" not in s.name]
    assert codec_totals(old) == {}
    assert codec_use({}, 5.0) == {}
    assert codec_use(Counts.between(_samples(3, 9, 1), _samples(3, 9, 1), 5.0).codec, 5.0) == {}
    report = {"source": "test", "levels": [], "scaling": None, "capacity": None}
    print_table(report)
    assert "codec" not in capsys.readouterr().out
    print_table({**report, "codec": [{"concurrency": 8, "pushes": 12, "frames_per_push": 2.5,
                                      "busy_share": 0.25}]})
    out = capsys.readouterr().out
    assert "c=8 codec: 12 pushes, 2.5 frames per push, busy 25% of the level's wall time" in out

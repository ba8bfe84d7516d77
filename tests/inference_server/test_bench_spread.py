"""Request lengths spread by ``bench.spread_frames`` (``bench serve`` and ``bench engine``'s
``--frames-spread``, the live route's ``live_prefix.py --frames-spread``): fixed per (seed, request),
inside the band, varied."""

from __future__ import annotations

from ttsfleet.inference.bench import BenchConfig, spread_frames


def test_no_spread_is_the_base_length():
    assert [spread_frames(128, 0.0, 3, i) for i in range(5)] == [128] * 5


def test_spread_lengths_are_fixed_by_seed_and_index_and_fill_the_band():
    got = [spread_frames(128, 0.5, 7, i) for i in range(400)]
    assert got == [spread_frames(128, 0.5, 7, i) for i in range(400)]  # reproducible
    assert got != [spread_frames(128, 0.5, 8, i) for i in range(400)]  # another seed, other lengths
    assert 64 <= min(got) < 72 and 184 < max(got) <= 192  # 128 x [0.5, 1.5], reached at both ends
    assert len(set(got)) > 100


def test_the_served_bench_uses_the_same_lengths():
    cfg = BenchConfig(url="http://x", levels=[1], max_new_tokens=96, frames_spread=0.25, seed=5)
    assert [cfg.frames_of(i) for i in range(20)] == [spread_frames(96, 0.25, 5, i) for i in range(20)]


def test_a_tiny_base_never_asks_for_zero_frames():
    assert min(spread_frames(1, 0.9, 0, i) for i in range(200)) == 1


def test_the_engine_bench_uses_the_same_lengths():
    from ttsfleet.inference.bench_engine import EngineBenchConfig, request_frames

    cfg = EngineBenchConfig(frames=128, frames_spread=0.5, seed=9)
    assert [request_frames(cfg, i) for i in range(20)] == [spread_frames(128, 0.5, 9, i) for i in range(20)]

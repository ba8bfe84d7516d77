"""Garbage-collection pauses (:mod:`ttsfleet.inference.gc_pauses`): a real full collection over a heap of
cycles must be seen with its generation and a duration, stopping must take the callback off the
collector, and the start-up freeze must leave the heap frozen; the server's histogram of the full passes
must read back through the bench as a span's count, sum and longest bucket. Why: a full pass stops every
thread of the process (~80 ms over torch's and the server's ~219k objects on the CPU box), and these
figures say whether such pauses sit in a served run's first-audio tail.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator

import pytest
from ttsfleet.inference.gc_pauses import GcPauses, freeze_heap, pause_summary


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycles(n: int) -> list[_Node]:
    """``n`` pairs that point at each other (one of each in the list): once the list goes, only the
    cyclic collector frees them."""
    heads = []
    for _ in range(n):
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        heads.append(a)
    return heads


@pytest.fixture
def unfrozen() -> Iterator[None]:
    """Whatever a test froze goes back to the collector, so later tests' collections see their heap."""
    yield
    gc.unfreeze()


def test_a_full_collection_over_cycles_is_timed_as_generation_2():
    watch = GcPauses()
    watch.start()
    try:
        heads = _cycles(20_000)  # reachable while made: the young collections meanwhile keep them
        del heads
        freed = gc.collect()  # generation 2: the full pass
    finally:
        watch.stop()
    assert freed >= 40_000  # the cycles were there to walk
    full = [s for g, s in watch.pauses if g == 2]
    assert full and all(s > 0 for s in full), watch.pauses
    summary = pause_summary(watch.pauses)["gen2"]
    assert summary["count"] == len(full) and 0 < summary["p50_ms"] <= summary["max_ms"]
    assert summary["total_ms"] == pytest.approx(1000 * sum(full), abs=0.01)


def test_a_young_collection_is_timed_with_its_generation_and_handed_to_on_pause():
    seen: list[tuple[int, float]] = []
    watch = GcPauses(on_pause=lambda gen, s: seen.append((gen, s)))
    watch.start()
    try:
        gc.collect(0)
        gc.collect(1)
    finally:
        watch.stop()
    assert [g for g, _ in seen if g in (0, 1)][-2:] == [0, 1] and all(s >= 0 for _, s in seen)
    assert watch.pauses == []  # handed on, not kept


def test_start_is_idempotent_and_stop_takes_the_callback_off():
    watch = GcPauses()
    before = len(gc.callbacks)
    watch.start()
    watch.start()
    assert len(gc.callbacks) == before + 1 and watch.running
    watch.stop()
    watch.stop()
    assert len(gc.callbacks) == before and not watch.running
    gc.collect()
    assert watch.pauses == []  # nothing seen once stopped


def test_freeze_heap_freezes_the_heap(unfrozen):
    gc.unfreeze()
    assert gc.get_freeze_count() == 0
    frozen, ms = freeze_heap()
    assert frozen == gc.get_freeze_count() > 1000 and ms > 0
    watch = GcPauses()
    watch.start()
    try:
        gc.collect()
    finally:
        watch.stop()
    assert [g for g, _ in watch.pauses] == [2]


def test_no_pauses_reads_as_zero_collections_and_nan():
    empty = pause_summary([])
    assert set(empty) == {"gen0", "gen1", "gen2"}
    assert empty["gen2"]["count"] == 0 and math.isnan(empty["gen2"]["max_ms"])


def test_bench_serve_reads_the_servers_full_collections_from_their_histogram():
    """The server's ``inference_gc_pause_seconds`` (a real prometheus_client histogram with the contract's
    labels and buckets) through the bench's two reads: the span's generation-2 pauses only, not the
    younger ones, not those before the span, and not as a phase of the step."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from ttsfleet.inference.bench_engine_loop import engine_line, engine_use
    from ttsfleet.inference.bench_steady import Counts

    from ttsfleet.metrics import spec

    pause = spec("inference_gc_pause_seconds")
    reg = CollectorRegistry()
    hist = Histogram(pause.name, "gc", list(pause.labels), buckets=pause.buckets, registry=reg)
    phases = Counter(spec("inference_engine_seconds").name, "phases", ["model", "phase"], registry=reg)
    steps = Histogram(spec("inference_batch_size").name, "batch", ["model"], registry=reg)

    def read() -> list:
        text = generate_latest(reg).decode()
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    phases.labels("tiny", "other").inc(0.5)
    hist.labels("tiny", "2").observe(0.9)  # before the span: must not count
    before = read()
    for _ in range(3):
        hist.labels("tiny", "2").observe(0.04)  # three 40 ms full passes in the span
    hist.labels("tiny", "2").observe(0.07)  # and one of 70 ms: the longest, in the 0.1 s bucket
    for _ in range(50):
        hist.labels("tiny", "0").observe(0.2)  # young ones, however long, are not full passes
    for _ in range(100):
        steps.labels("tiny").observe(32)
    phases.labels("tiny", "other").inc(1.0)
    use = engine_use(Counts.between(before, read(), 4.0).engine, 4.0)
    assert use["step_ms"] == 10.0  # the pauses are not a phase of the step
    assert use["gc2_count"] == 4 and use["gc2_total_ms"] == pytest.approx(190.0)
    assert use["gc2_max_le_ms"] == 100.0 and 50 < use["gc2_p99_ms"] <= 100
    assert engine_line({"concurrency": 32, **use}, "steady window").endswith(
        "; its full garbage collections 4x, 190 ms in all, the longest <= 100 ms")
    hist.labels("tiny", "2").observe(3.0)  # past the last bound
    longer = engine_use(Counts.between(before, read(), 4.0).engine, 4.0)
    assert longer["gc2_max_above_ms"] == 1000.0 and "gc2_max_le_ms" not in longer


def test_the_client_lag_line_gives_the_clients_own_collections():
    from ttsfleet.inference.bench import _client_lag_line

    lv = {"concurrency": 8, "client_loop_lag": {"p50_ms": 0.4, "p99_ms": 30.0, "max_ms": 95.0, "ticks": 900},
          "client_gc": {**pause_summary([(2, 0.085), (2, 0.015), (0, 0.001), (1, 0.002)]), "frozen": 250_000}}
    assert _client_lag_line(lv).endswith(
        "; its garbage collections paused it 2x full (max 85 ms, 100 ms in all), 2x young (3 ms in all), "
        "250,000 objects frozen")
    old = {k: v for k, v in lv.items() if k != "client_gc"}  # a report from before 2026-12-07
    assert _client_lag_line(old).endswith("first audio are that much late")

"""Event-loop lag (:mod:`ttsfleet.inference.loop_lag`): a loop held up by a blocking call must show that
call's length in the lag, and a free loop must not; the server's histogram of it must read back through
the bench as the span's mean and p99. Why: the figures say whether a served run's first-audio tail is the
server's loop, the client's own late reads, or neither."""

from __future__ import annotations

import asyncio
import math
import threading
import time

import pytest
from ttsfleet.inference.loop_lag import LoopLag, ThreadLag, lag_summary, lags_between


async def _run(block_s: float) -> LoopLag:
    lag = LoopLag()
    lag.start()
    await asyncio.sleep(0.05)
    time.sleep(block_s)  # the loop's thread busy, as a client parsing chunks without pause would be
    await asyncio.sleep(0.05)
    await lag.stop()
    return lag


def test_a_blocked_loop_shows_the_block_and_a_free_one_does_not():
    blocked = lag_summary(asyncio.run(_run(0.12)).lags_s)
    assert blocked["max_ms"] >= 100, blocked
    free = lag_summary(asyncio.run(_run(0.0)).lags_s)
    assert free["ticks"] >= 5 and free["p50_ms"] < 20, free


def test_stop_ends_the_ticker_and_no_lags_is_nan():
    lag = asyncio.run(_run(0.0))
    ticks = len(lag.lags_s)
    time.sleep(0.03)
    assert len(lag.lags_s) == ticks and lag._task is None
    empty = lag_summary([])
    assert empty["ticks"] == 0 and math.isnan(empty["p99_ms"])


def _hold_the_interpreter(seconds: float) -> int:
    """How many ``sum(range(n))`` terms take at least ``seconds``: one C call that never lets the
    interpreter lock go (no bytecode runs inside it, so no switch interval can take it)."""
    n = 200_000
    while True:
        t0 = time.perf_counter()
        sum(range(n))
        if time.perf_counter() - t0 >= seconds:
            return n
        n *= 2


def _thread_lag(hold_n: int) -> tuple[ThreadLag, list[float]]:
    """A :class:`ThreadLag` over 0.4 s, beside a thread that holds the lock ``hold_n`` terms at a time
    with 10 ms free between (none where ``hold_n`` is 0); the holds' lengths (s)."""
    lag, done, holds = ThreadLag(), threading.Event(), []

    def hold() -> None:
        while not done.is_set():
            t0 = time.perf_counter()
            sum(range(hold_n))
            holds.append(time.perf_counter() - t0)
            time.sleep(0.01)

    holder = threading.Thread(target=hold, daemon=True)
    lag.start()
    if hold_n:
        holder.start()
    time.sleep(0.4)
    done.set()
    if hold_n:
        holder.join()
    lag.stop()
    return lag, holds


def test_a_thread_kept_from_the_interpreter_shows_the_hold_and_a_free_one_does_not():
    """The live bench's threads share one interpreter lock: a wake-up that waits for it is late by the
    wait. Holds of ~100 ms (>= 50 ms on a noisy machine) must show as a lag of >= 40 ms (the probe wakes
    within a tick of a hold's start, so it waits nearly all of it); without a holder the lags stay small."""
    held, holds = _thread_lag(_hold_the_interpreter(0.1))
    assert min(holds) >= 0.05 and len(holds) >= 2, holds
    blocked = lag_summary(held.lags_s)
    assert blocked["max_ms"] >= 40, (blocked, holds)
    free_lag, _ = _thread_lag(0)
    free = lag_summary(free_lag.lags_s)
    assert free["ticks"] >= 20 and free["p50_ms"] < 20, free
    assert free["ticks"] > blocked["ticks"]  # the held probe woke less often: it waited


def test_thread_lag_stops_and_cuts_to_a_window():
    lag, _ = _thread_lag(0)
    ticks = len(lag.lags_s)
    assert lag._thread is None and ticks == len(lag.at_s) and ticks >= 5
    time.sleep(0.03)
    assert len(lag.lags_s) == ticks  # stopped: no more wake-ups
    assert lag.at_s == sorted(lag.at_s)
    mid = lag.at_s[ticks // 2]
    inside = lags_between(lag.at_s, lag.lags_s, mid, lag.at_s[-1])
    assert inside == lag.lags_s[ticks // 2:]
    assert lags_between(lag.at_s, lag.lags_s, lag.at_s[-1] + 1, lag.at_s[-1] + 2) == []


def test_bench_serve_reads_the_servers_loop_lag_from_its_histogram():
    """The server's ``inference_event_loop_lag_seconds`` (a real prometheus_client histogram with the
    contract's buckets) through the bench's two reads: the span's mean and p99, not the phase sums."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from ttsfleet.inference.bench_engine_loop import engine_line, engine_use
    from ttsfleet.inference.bench_steady import Counts

    from ttsfleet.metrics import LOOP_LAG_BUCKETS, spec

    reg = CollectorRegistry()
    lag = Histogram(spec("inference_event_loop_lag_seconds").name, "lag", ["model"],
                    buckets=LOOP_LAG_BUCKETS, registry=reg)
    phases = Counter(spec("inference_engine_seconds").name, "phases", ["model", "phase"], registry=reg)
    steps = Histogram(spec("inference_batch_size").name, "batch", ["model"], registry=reg)

    def read() -> list:
        text = generate_latest(reg).decode()
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    phases.labels("tiny", "other").inc(0.5)  # a server's engine exports its phases from the start
    for _ in range(50):  # before the span: a stalled loop that must not count
        lag.labels("tiny").observe(0.9)
    before = read()
    for i in range(200):
        lag.labels("tiny").observe(0.0002 if i < 196 else 0.3)  # 2 % of the ticks 300 ms late
        steps.labels("tiny").observe(64)
    phases.labels("tiny", "other").inc(2.0)
    use = engine_use(Counts.between(before, read(), 4.0).engine, 4.0)
    assert use["loop_lag_ticks"] == 200 and use["step_ms"] == 10.0  # the lag is not a phase of the step
    assert 250 < use["loop_lag_p99_ms"] <= 500 and use["loop_lag_mean_ms"] == pytest.approx(6.196, abs=0.001)
    assert engine_line({"concurrency": 64, **use}, "steady window").endswith(
        "; the server's event loop late by mean 6.20 ms, p99 "
        f"{use['loop_lag_p99_ms']:.1f} ms (200 ticks)")

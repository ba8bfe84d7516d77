"""The bench client's event-loop lag (:mod:`ttsfleet.inference.bench_loop_lag`): a loop held up by a
blocking call must show that call's length in the lag, and a free loop must not. Why: the figure says
whether a served run's first-audio tail is the server's or the client's own late reads."""

from __future__ import annotations

import asyncio
import math
import time

from ttsfleet.inference.bench_loop_lag import LoopLag, lag_summary


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

"""The bench's trace of where a request's wait for the response headers goes on the client's side."""

from __future__ import annotations

import asyncio
import math
import time

import httpx
from ttsfleet.inference.bench_trace import RequestTrace


def test_the_trace_tells_a_new_connection_from_a_pooled_one(server):
    async def two() -> list[tuple[RequestTrace, float]]:
        out = []
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(2):
                trace, t0 = RequestTrace(), time.perf_counter()
                async with client.stream("GET", f"{server.url}/healthz", extensions={"trace": trace}) as r:
                    assert r.status_code == 200
                    await r.aread()
                out.append((trace, t0))
        return out

    (first, t0), (second, t1) = asyncio.run(two())
    assert first.new_connection and not second.new_connection
    assert 0 < first.connect_s() < 5 and second.connect_s() == 0
    assert 0 < first.sent_s(t0) < 5 and 0 < second.sent_s(t1) < 5
    assert first.sent_s(t0) >= first.connect_s()


def test_a_request_never_written_has_no_send_time():
    trace = RequestTrace()
    assert not trace.new_connection and trace.connect_s() == 0 and math.isnan(trace.sent_s(0.0))

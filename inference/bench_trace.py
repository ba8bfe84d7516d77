"""Where a benchmark request's wait for the response headers goes on the client's side of the wire:
httpcore's ``trace`` extension marks when the pool handed the request a connection (a new one's TCP
connect timed apart) and when the request was fully written.

Why: on an H100 at c=128 (2026-12-07e) the client's wait for the headers reached a p99 of 1.1-6.2 s while
the server's app, by its own ``Server-Timing``, spent at most ~0.2 s on any request before them: the
rest lies between the client and the app. The split says which side: the client's pool and connect
(it was the bench's one shared httpx pool, :mod:`.bench_clients`), or the server's way in (its event
loop reading and parsing the request) and the headers' way out.
"""

from __future__ import annotations

import math
import time
from typing import Any

#: httpcore's trace events (``<module>.<step>.<started|complete>``) this reads.
CONNECT_STARTED = "connection.connect_tcp.started"
CONNECT_DONE = "connection.connect_tcp.complete"
SENT = "http11.send_request_body.complete"


class RequestTrace:
    """The ``trace`` extension of one request: the time of each httpcore event it passed.

    ``extensions={"trace": trace}`` on an httpx request of an async client (httpcore insists on an
    async callback there)."""

    def __init__(self) -> None:
        self.marks: dict[str, float] = {}

    async def __call__(self, name: str, info: dict[str, Any]) -> None:
        self.marks.setdefault(name, time.perf_counter())

    @property
    def new_connection(self) -> bool:
        """Whether the request opened a TCP connection of its own (none pooled was free)."""
        return CONNECT_STARTED in self.marks

    def connect_s(self) -> float:
        """The new connection's TCP connect (s), 0 on a pooled one, nan if it never completed."""
        if not self.new_connection:
            return 0.0
        done = self.marks.get(CONNECT_DONE)
        return math.nan if done is None else done - self.marks[CONNECT_STARTED]

    def sent_s(self, t0: float) -> float:
        """From ``t0`` (the request's start) until it was written out whole: the wait for a pooled
        connection or a new one's connect, and the send."""
        sent = self.marks.get(SENT)
        return math.nan if sent is None else sent - t0

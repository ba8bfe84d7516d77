"""The bench's HTTP clients: one connection per simulated listener, never one pool shared by all.

Why: with one ``httpx.AsyncClient`` for every listener, httpcore's pool hands a connection that just
went idle to every request queued at that moment; all but one then meet ``ConnectionNotAvailable`` and
wait for the pool's next event to be assigned again (encode/httpcore#822). The served path finishes
many streams in the same codec round, so requests queue together: on the 2-core CPU box against a
stand-in server that only streams bytes, requests waited up to 0.46-0.60 s before they were written at
c=64 and 5.1-5.4 s at c=128 (`benchmarks/inference_serve/client-pool-2026-12-07`; own connections: 23-28
and 81-83 ms), time the bench counted as the server's first audio. A listener with its own client has
its own connection, as a real listener does; ``shared`` keeps the old pool for side-by-side runs.
"""

from __future__ import annotations

import ssl
from typing import Any

#: ``--connections``: ``own`` (the default: a client and connection per listener) or ``shared``.
CONNECTION_MODES = ("own", "shared")


class ListenerClients:
    """httpx clients handed to listeners: ``own`` mode gives each taker a client of one connection (a
    returned one is reused by the next taker, so an open loop keeps as many as it has in flight),
    ``shared`` mode one pooled client to all (``limit`` connections)."""

    def __init__(self, mode: str, timeout_s: float, limit: int | None = None):
        import httpx

        if mode not in CONNECTION_MODES:
            raise ValueError(f"connections must be one of {', '.join(CONNECTION_MODES)}, not {mode!r}")
        self.mode = mode
        self._timeout_s = timeout_s
        self._tls = ssl.create_default_context()  # loaded once: a client builds its own otherwise
        self._idle: list[Any] = []
        self._all: list[Any] = []
        self._shared = None
        if mode == "shared":
            # as before 2026-12-07e: a closed loop's c + 4 connections, an open loop's unbounded (64 kept)
            limits = httpx.Limits(max_connections=limit, max_keepalive_connections=limit or 64)
            self._shared = httpx.AsyncClient(timeout=timeout_s, limits=limits, verify=self._tls)
            self._all.append(self._shared)

    def take(self) -> Any:
        """A client for one listener (the shared one, or an idle own one, or a new one)."""
        if self._shared is not None:
            return self._shared
        if self._idle:
            return self._idle.pop()
        import httpx

        one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        client = httpx.AsyncClient(timeout=self._timeout_s, limits=one, verify=self._tls)
        self._all.append(client)
        return client

    def give(self, client: Any) -> None:
        """The listener is done with ``client``: the next taker reuses it (and its connection)."""
        if client is not self._shared:
            self._idle.append(client)

    @property
    def opened(self) -> int:
        """How many clients were made (``own``: the most listeners in flight at once)."""
        return len(self._all)

    async def aclose(self) -> None:
        for client in self._all:
            await client.aclose()

    async def __aenter__(self) -> ListenerClients:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

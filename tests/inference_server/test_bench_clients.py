"""The bench's listeners' clients: one connection each by default, the old shared pool on request."""

from __future__ import annotations

import asyncio

import pytest
from ttsfleet.inference.bench_clients import ListenerClients


def test_own_clients_are_one_per_listener_and_reused_once_given_back():
    async def run() -> None:
        async with ListenerClients("own", 30) as clients:
            a, b = clients.take(), clients.take()
            assert a is not b and clients.opened == 2
            assert a._transport._pool._max_connections == 1  # one connection: no pool to share
            clients.give(a)
            assert clients.take() is a and clients.opened == 2
            assert clients.take() is not b and clients.opened == 3
        assert a.is_closed and b.is_closed

    asyncio.run(run())


def test_the_shared_client_is_one_pool_for_every_listener():
    async def run() -> None:
        async with ListenerClients("shared", 30, limit=68) as clients:
            a, b = clients.take(), clients.take()
            assert a is b and clients.opened == 1 and a._transport._pool._max_connections == 68
            clients.give(a)
            assert clients.take() is a

    asyncio.run(run())


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="own, shared"):
        ListenerClients("pooled", 30)


def test_own_connections_carry_requests_to_a_real_server(server):
    """Through the real server: each listener's requests reuse its one connection."""
    from ttsfleet.inference.bench import BenchConfig, _request

    cfg = BenchConfig(url=server.url, levels=[2], max_new_tokens=4, api_key=server.api_key)

    async def run() -> list:
        async with ListenerClients("own", 60) as clients:
            mine = clients.take()
            return [await _request(mine, cfg, i) for i in range(3)]

    first, *later = asyncio.run(run())
    assert first.ok and all(s.ok for s in later)
    assert first.new_connection and not any(s.new_connection for s in later)

"""The operator process: metrics endpoint, kopf with liveness, and a clean shutdown.

``serve`` is what ``ttsfleet operator run`` awaits (with ``--leader-elect``: only while holding
the Lease, :mod:`ttsfleet.operator.leader`); tests call :func:`operator_task` with their own
Runtime and stop flag to run the same wiring in-process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import kopf
from ttsfleet.operator.handlers import build_registry, configure
from ttsfleet.operator.leader import LeaderElector, LeaseConfig, run_elected
from ttsfleet.operator.runtime import Runtime

from ttsfleet.catalog import GpuCatalog


async def operator_task(rt: Runtime, *, namespaces: Sequence[str] = (), liveness: str | None = None,
                        stop_flag: asyncio.Event | None = None,
                        ready_flag: asyncio.Event | None = None) -> None:
    settings = configure(kopf.OperatorSettings())
    await kopf.operator(
        registry=build_registry(rt), settings=settings, standalone=True,
        clusterwide=not namespaces, namespaces=list(namespaces),
        liveness_endpoint=liveness, stop_flag=stop_flag, ready_flag=ready_flag,
        memo=kopf.Memo(),
    )


async def standby_health(port: int) -> None:
    """``GET /healthz`` while waiting for the Lease (kopf serves it once leading): a standby
    replica is alive, so its liveness probe must not restart it."""
    from aiohttp import web

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"standby": True})
    app = web.Application()
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def serve(*, metrics_port: int, health_port: int, namespaces: Sequence[str],
                autoscale_interval_s: float, fill_interval_s: float,
                catalog: GpuCatalog, lease: LeaseConfig | None = None) -> None:
    """Run the operator; with ``lease``, only while holding that Lease (leader election)."""
    from prometheus_client import start_http_server

    rt = Runtime.from_environment(autoscale_interval_s=autoscale_interval_s,
                                  fill_interval_s=fill_interval_s,
                                  catalog=catalog)
    server, thread = start_http_server(metrics_port, registry=rt.metrics.registry)
    liveness = f"http://0.0.0.0:{health_port}/healthz"
    try:
        if lease is None:
            await operator_task(rt, namespaces=namespaces, liveness=liveness)
        else:
            await run_elected(LeaderElector(rt.kube, lease),
                              lambda: operator_task(rt, namespaces=namespaces, liveness=liveness),
                              standby=lambda: standby_health(health_port))
    finally:
        server.shutdown()
        thread.join(timeout=5)
        await rt.aclose()

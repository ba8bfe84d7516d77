"""The operator process: metrics endpoint, kopf with liveness, and a clean shutdown.

``serve`` is what ``ttsfleet operator run`` awaits; tests call :func:`operator_task` with their
own Runtime and stop flag to run the same wiring in-process.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import kopf
from ttsfleet.operator.handlers import build_registry, configure
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


async def serve(*, metrics_port: int, health_port: int, namespaces: Sequence[str],
                autoscale_interval_s: float, fill_interval_s: float,
                catalog: GpuCatalog | None = None) -> None:
    from prometheus_client import start_http_server

    rt = Runtime.from_environment(autoscale_interval_s=autoscale_interval_s,
                                  fill_interval_s=fill_interval_s,
                                  catalog=catalog or GpuCatalog.default())
    server, thread = start_http_server(metrics_port, registry=rt.metrics.registry)
    try:
        await operator_task(rt, namespaces=namespaces, liveness=f"http://0.0.0.0:{health_port}/healthz")
    finally:
        server.shutdown()
        thread.join(timeout=5)
        await rt.aclose()

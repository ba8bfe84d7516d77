"""Probes and metrics, open without an API key (kubelet and Prometheus carry none): ``/healthz``
(alive: 503 only when the model failed to load or the engine died), ``/readyz`` (takes traffic:
503 while loading or draining) and ``/metrics``.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from ttsfleet.inference.http_common import get_state
from ttsfleet.inference.server_state import ServerState

router = APIRouter(tags=["probes"])


@router.get("/healthz")
@router.get("/v1/health")
async def healthz(state: ServerState = Depends(get_state)) -> JSONResponse:
    if state.load_error or (state.loaded.is_set() and not state.engine.alive):
        return JSONResponse({"status": "unhealthy", "error": state.load_error or "engine stopped"}, 503)
    return JSONResponse({"status": "ok", "loaded": state.loaded.is_set(), "draining": state.draining})


@router.get("/readyz")
async def readyz(state: ServerState = Depends(get_state)) -> JSONResponse:
    body = {"ready": state.ready, "loaded": state.loaded.is_set(), "draining": state.draining,
            "in_flight": state.in_flight, "pending": state.pending, "reading": state.reading}
    return JSONResponse(body, status_code=200 if state.ready else 503)


@router.get("/metrics")
async def metrics(state: ServerState = Depends(get_state)) -> Response:
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

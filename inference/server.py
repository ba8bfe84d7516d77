"""``ttsfleet serve``: the HTTP front of the engine — Fish Audio ``/v1/tts`` and live WebSocket
``/v1/tts/live``, OpenAI ``/v1/audio/speech``, reference voices, health/readiness, Prometheus metrics,
overload shedding and SIGTERM drain.

Why it looks like this: the operator scales replicas on the metrics exported here and removes them
with SIGTERM, so the server must (a) say honestly how loaded it is (in-flight, queue depth, batch
size, time to first audio), (b) shed load with 429 + Retry-After instead of growing memory, and
(c) on SIGTERM turn unready, answer new requests with 503, finish every admitted request, and only
then exit — a scale-down drops nothing. The model loads in the background so probes answer at once.

This module only assembles the app (one router per concern: ``routes_tts``, ``routes_live``,
``routes_references``, ``routes_voices``, ``routes_probes``; shared dependencies in ``http_common``)
and runs it under uvicorn with the drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import Any

from ttsfleet.inference import mps, server_loop
from ttsfleet.inference.serve_config import ENV, ServeConfig
from ttsfleet.inference.server_state import ServerState

__all__ = ["ENV", "ServeConfig", "ServerState", "create_app", "run"]

log = logging.getLogger("ttsfleet.inference.server")


def create_app(state: ServerState, load_in_background: bool = True) -> Any:
    """The FastAPI app over ``state``; the model starts loading when the app starts."""
    from fastapi import FastAPI
    from ttsfleet.inference import routes_live, routes_probes, routes_references, routes_tts, routes_voices
    from ttsfleet.inference.http_common import StampReceived, install_error_handlers
    from ttsfleet.inference.openapi_docs import install_openapi

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        from ttsfleet.inference.gc_pauses import GcPauses
        from ttsfleet.inference.loop_lag import LoopLag

        # every garbage collection's pause, from before the load: the start-up freeze's own full pass too
        gc_pauses = GcPauses(on_pause=_gc_pause_observer(state))
        gc_pauses.start()
        # A daemon thread, so a SIGTERM during a long load exits at once instead of waiting for it.
        loader = threading.Thread(target=state.load, name="ttsfleet-load", daemon=True)
        loader.start()
        if not load_in_background:
            await asyncio.to_thread(loader.join)
        # this loop's lateness, every request's first audio passes through it (inference/loop_lag.py)
        lag = LoopLag(tick_s=0.01, on_lag=state.m("inference_event_loop_lag_seconds").observe)
        lag.start()
        try:
            yield
        finally:
            await lag.stop()
            gc_pauses.stop()
            if state.engine is not None and state.loaded.is_set():
                await asyncio.to_thread(state.engine.stop)

    app = FastAPI(title="ttsfleet TTS server", version="0.2.0", lifespan=lifespan,
                  description="Fish Audio and OpenAI compatible text to speech.")
    app.state.tts = state
    install_error_handlers(app)
    for module in (routes_tts, routes_live, routes_references, routes_voices, routes_probes):
        app.include_router(module.router)
    install_openapi(app)
    app.add_middleware(StampReceived)  # outermost of the app's own: the stamp comes before everything else
    return app


def _gc_pause_observer(state: ServerState) -> Callable[[int, float], None]:
    """``inference_gc_pause_seconds``'s observe by generation: its three series made now, so each shows
    from the start (at 0) and the collector's callback only observes (no label lookup inside a pause)."""
    from ttsfleet.inference.gc_pauses import GENERATIONS

    family = state.metrics["inference_gc_pause_seconds"]
    series = {gen: family.labels(state.label, str(gen)) for gen in GENERATIONS}

    def observe(generation: int, seconds: float) -> None:
        series[generation].observe(seconds)

    return observe


# ---------------------------------------------------------------------- process: uvicorn + drain
def run(cfg: ServeConfig, log_level: str = "info") -> int:
    """Serve until SIGTERM/SIGINT, then drain: unready, 503 for new requests, finish in-flight, exit 0.
    Under MPS (``inference/mps.py``) where the config asks for it: started before any CUDA context."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not cfg.api_keys and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s without an API key: anyone who reaches this port can use it "
                    "(--api-key / TTSFLEET_API_KEYS)", cfg.host)
    with mps.serving_under_mps(cfg.mps, cfg.codec_process, cfg.device):
        return _serve(cfg, log_level)


def _serve(cfg: ServeConfig, log_level: str) -> int:
    import uvicorn

    state = ServerState(cfg)
    app = create_app(state)

    class DrainingServer(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # runs in the main thread
            if state.draining:
                if sig == signal.SIGINT:  # second Ctrl-C: stop now
                    self.should_exit = True
                    self.force_exit = True
                return
            state.begin_drain()

    http = server_loop.http_parser()
    log.info("event loop %s, HTTP parser %s", server_loop.event_loop_name(), http)
    config = uvicorn.Config(app, host=cfg.host, port=cfg.port, log_level=log_level, access_log=False,
                            http=http, lifespan="on",
                            # the drain already waited for requests; this only lets the last bytes go out
                            timeout_graceful_shutdown=5)
    server = DrainingServer(config)

    async def watch_drain() -> None:
        while not server.should_exit:
            await asyncio.sleep(0.05)
            if state.drain_started is None:
                continue
            waited = time.monotonic() - state.drain_started
            idle = state.busy == 0
            if (idle and waited >= cfg.drain_grace_s) or waited >= cfg.drain_timeout_s:
                if not idle:
                    log.warning("drain timeout: %d requests still in flight", state.busy)
                if state.reading:
                    log.info("drained; %d requests still sending their body get 503", state.reading)
                state.end_body_reads()  # their 503s go out during uvicorn's graceful shutdown
                log.info("drained; exiting")
                server.should_exit = True

    async def main() -> None:
        watcher = asyncio.create_task(watch_drain())
        try:
            await server.serve()
        finally:
            watcher.cancel()

    if cfg.gil_switch_ms > 0:
        sys.setswitchinterval(cfg.gil_switch_ms / 1000)
    server_loop.run(main)
    return 0 if state.load_error is None else 1

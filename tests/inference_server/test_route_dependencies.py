"""Every dependency of every route is a coroutine function.

Why: FastAPI runs a plain ``def`` dependency on anyio's worker threads; each such hop has to win the GIL
from the engine and codec threads before the request reaches its handler, a wait the server's own
timings would not see. This walks the real app's routes, so a new sync dependency fails here.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any


def _calls(dependant: Any) -> Iterator[Any]:
    for dep in dependant.dependencies:
        yield dep.call
        yield from _calls(dep)


def _route_calls(routes: list[Any]) -> Iterator[tuple[str, Any]]:
    """(path, dependency) for every route, through included routers (FastAPI >= 0.13x keeps them as
    ``original_router``; older ones flatten them into ``app.routes``) and their own ``dependencies``."""
    for route in routes:
        if hasattr(route, "dependant"):
            yield from ((route.path, call) for call in _calls(route.dependant))
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from ((inner.prefix or "/", d.dependency) for d in inner.dependencies)
            yield from _route_calls(inner.routes)


def test_no_route_dependency_runs_on_a_worker_thread():
    from ttsfleet.inference.serve_config import ServeConfig
    from ttsfleet.inference.server import create_app
    from ttsfleet.inference.server_state import ServerState

    app = create_app(ServerState(ServeConfig(checkpoint="tiny", device="cpu")))
    calls = list(_route_calls(app.routes))
    assert {"/v1/tts", "/v1/audio/speech"} <= {path for path, _ in calls}
    sync = sorted({f"{path}: {c.__qualname__}" for path, c in calls if not inspect.iscoroutinefunction(c)})
    assert not sync, f"dependencies that would run on a worker thread: {sync}"

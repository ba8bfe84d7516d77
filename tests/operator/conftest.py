"""Fixtures for the operator tests: a kmock Kubernetes emulator kopf can run against, a kubeconfig
pointing at it, an in-process operator, and a real HTTP server exposing inference metrics.

kmock 0.8 never stamps ``resourceVersion``/``uid``/``generation``/``creationTimestamp`` and answers
a failed JSON-patch ``test`` with 500; kopf needs all of that (see shared/notes/test-stack.md).
:class:`Emulator` adds exactly those behaviours and nothing the operator's logic depends on.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import kmock
import pytest
from kmock._internal import enums, k8s
from prometheus_client import generate_latest
from ttsfleet.operator.main import operator_task
from ttsfleet.operator.runtime import Runtime

from ttsfleet.catalog import GpuCatalog
from ttsfleet.metrics import make_collectors

_counter = itertools.count(1000)
_last_rv = [0]


def _next_rv() -> int:
    _last_rv[0] = next(_counter)
    return _last_rv[0]


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """kmock's emulator plus the API-server behaviours kopf relies on."""

    async def _serve_list(self, request: kmock.Request) -> Any:
        payload = await super()._serve_list(request)
        payload["metadata"]["resourceVersion"] = str(_last_rv[0])  # a real list revision
        return payload

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        # kmock subscribes to its event bus only after streaming the initial objects, so a write
        # that lands in between is never delivered and kopf waits forever for its own patch.
        # Subscribe first, then snapshot; and like the API server, a watch that starts from a
        # listing's resourceVersion only gets what changed after it (no stale replay).
        yield b""
        since = int(request.params.get("resourceVersion") or 0) if \
            str(request.params.get("resourceVersion") or "0").isdigit() else 0
        bus = self._buses[request.resource]
        mark = await bus.mark()

        def wanted(raw: dict[str, Any]) -> bool:
            meta = raw.get("metadata", {})
            return ((request.namespace is None or meta.get("namespace") == request.namespace)
                    and (request.name is None or meta.get("name") == request.name))

        try:
            async with self._lock:
                snapshot = [obj.raw for (res, _, _), obj in self.objects.items()
                            if res == request.resource and not obj.deleted]
            for raw in snapshot:
                if wanted(raw) and int(raw.get("metadata", {}).get("resourceVersion", 0)) > since:
                    yield {"type": "ADDED", "object": raw}
            async for event in bus.stream(since=mark):
                if wanted(event.get("object", {})):
                    yield event
        finally:
            await bus.unmark(mark)

    async def expire_watches(self, plural: str) -> int:
        """What an API server tells a cluster-wide watcher it can no longer serve (its revision
        compacted away): an ERROR event with a 410 Expired Status. Returns the watches told."""
        told = 0
        for resource, bus in self._buses.items():
            if getattr(resource, "plural", None) == plural:
                await bus.put({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                    "code": 410, "message": "too old resource version"}})
                told += 1
        return told

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        if request.resource is not None and request.action == enums.action.CREATE \
                and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = str(_next_rv())
            meta.setdefault("generation", 1)
            meta.setdefault("creationTimestamp",
                            datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
        elif request.resource is not None and request.action == enums.action.UPDATE \
                and request.name is not None:
            key = (request.resource, request.namespace, request.name)
            if key in self.objects and not self.objects[key].deleted:
                current = self.objects[key].raw
                if isinstance(request.data, list):
                    try:
                        jsonpatch.apply_patch(current, [op for op in request.data if op.get("op") == "test"])
                    except jsonpatch.JsonPatchException as exc:
                        return await self._render_error(k8s.KubernetesError(
                            status=422, reason="Invalid", message=f"the test operation failed: {exc}"))
                    request.data.append({"op": "replace", "path": "/metadata/resourceVersion",
                                         "value": str(_next_rv())})
                elif isinstance(request.data, dict):
                    meta = request.data.setdefault("metadata", {})
                    meta["resourceVersion"] = str(_next_rv())
                    if "spec" in request.data and request.subresource is None \
                            and request.data["spec"] != current.get("spec"):
                        meta["generation"] = int(current.get("metadata", {}).get("generation", 1)) + 1
        response = await super()._handle(request)
        if request.action == enums.action.CREATE and response.status == 200:
            response.set_status(201)
        return response


CRD_RESOURCES = {
    "ttsfleet.io/v1alpha1/ttsdeployments": ("TTSDeployment", "ttsdeployment", True),
    "ttsfleet.io/v1alpha1/filljobs": ("FillJob", "filljob", True),
}
BUILTIN = {
    "apps/v1/deployments": ("Deployment", "deployment", True),
    "v1/services": ("Service", "service", True),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", "poddisruptionbudget", True),
    "v1/pods": ("Pod", "pod", True),
    "v1/nodes": ("Node", "node", False),
    "v1/events": ("Event", "event", True),
}


@pytest.fixture
def kmock_options() -> dict[str, Any]:
    return {"cls": Emulator}


@pytest.fixture
async def cluster(kmock: Emulator, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Emulator:
    """The emulator with the operator's resources registered and $KUBECONFIG pointing at it."""
    kmock.resources.load_bundled()  # built-in kinds, CRDs, events: kopf's discovery backbone
    for key, (kind, singular, namespaced) in {**CRD_RESOURCES, **BUILTIN}.items():
        info = kmock.resources[key]
        info.kind, info.singular, info.namespaced = kind, singular, namespaced
        info.verbs = {"get", "list", "watch", "create", "patch", "delete"}
        if key in CRD_RESOURCES:
            info.subresources = {"status"}
    config = tmp_path / "kubeconfig"
    config.write_text(f"""
apiVersion: v1
kind: Config
current-context: kmock
clusters: [{{name: kmock, cluster: {{server: "{kmock.url!s}"}}}}]
users: [{{name: kmock, user: {{token: test-token}}}}]
contexts: [{{name: kmock, context: {{cluster: kmock, user: kmock}}}}]
""")
    monkeypatch.setenv("KUBECONFIG", str(config))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TTSFLEET_PROMETHEUS_URL", raising=False)
    return kmock


@contextlib.asynccontextmanager
async def running_operator(rt: Runtime, namespaces: tuple[str, ...] = ("ns1",)) -> AsyncIterator[Runtime]:
    """Run the real operator wiring in this event loop; stop it on exit (inside the test body)."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator_task(rt, namespaces=namespaces, stop_flag=stop, ready_flag=ready))
    rt.kopf_task = task  # type: ignore[attr-defined]  # a test may kill it (cancel) mid-pass
    try:
        await asyncio.wait_for(ready.wait(), timeout=30)
        yield rt
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=30)


@pytest.fixture
def make_runtime(cluster: Emulator) -> Callable[..., Runtime]:
    def make(**kw: Any) -> Runtime:
        kw.setdefault("autoscale_interval_s", 5.0)
        kw.setdefault("fill_interval_s", 5.0)
        kw.setdefault("catalog", GpuCatalog.default())  # the tests' entry point: the built-in catalog
        return Runtime.from_environment(**kw)
    return make


class MetricsServer:
    """A real HTTP server exposing the inference metric contract through prometheus-client."""

    def __init__(self, component: str = "inference") -> None:
        self.collectors = make_collectors(component)
        self.runner: aiohttp.web.AppRunner | None = None
        self.port = 0

    def set(self, in_flight: float, queue: float = 0.0, ttfa: list[float] | None = None) -> None:
        self.collectors["inference_requests_in_flight"].labels(model="m").set(in_flight)
        self.collectors["inference_queue_depth"].labels(model="m").set(queue)
        for v in ttfa or []:
            self.collectors["inference_ttfa_seconds"].labels(model="m").observe(v)

    async def _metrics(self, _: aiohttp.web.Request) -> aiohttp.web.Response:
        return aiohttp.web.Response(body=generate_latest(self.collectors.registry),
                                    content_type="text/plain")

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> MetricsServer:
        app = aiohttp.web.Application()
        app.router.add_get("/metrics", self._metrics)
        self.runner = aiohttp.web.AppRunner(app)
        await self.runner.setup()
        site = aiohttp.web.TCPSite(self.runner, host, port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def metrics_servers() -> AsyncIterator[Callable[[], Any]]:
    servers: list[MetricsServer] = []

    async def make(component: str = "inference") -> MetricsServer:
        s = await MetricsServer(component).start()
        servers.append(s)
        return s

    yield make
    for s in servers:
        await s.stop()

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
import signal
import sys
import threading
import uuid
import warnings
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

from tests.operator import stopping
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
    """Run the real operator wiring in this event loop; stop it on exit (inside the test body).

    The stop is bounded in real time (:mod:`tests.operator.stopping`): the stop flag, then
    cancellation; an operator task that still runs raises :class:`~tests.operator.stopping.StuckTask`
    naming where it waits (a note on the test's own error when the block failed) instead of hanging."""
    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(operator_task(rt, namespaces=namespaces, stop_flag=stop, ready_flag=ready),
                               name="kopf operator (running_operator)")
    rt.kopf_task = task  # type: ignore[attr-defined]  # a test may kill it (cancel) mid-pass
    failing: BaseException | None = None
    try:
        await _until_ready(task, ready)
        yield rt
    except BaseException as exc:
        failing = exc
        raise
    finally:
        stop.set()
        try:
            await stopping.stop_task(task, "the kopf operator task")
        except Exception as problem:  # StuckTask, or what the operator itself failed with
            stopping.note(failing, problem)
        finally:
            _remove_kopf_signal_handlers()


async def _until_ready(task: asyncio.Task[None], ready: asyncio.Event, timeout_s: float = 30) -> None:
    """Wait (on the loop's clock, as before) for kopf's ready flag; an operator that ends first
    raises what it failed with, not a timeout."""
    flag = asyncio.create_task(ready.wait(), name="operator ready flag")
    try:
        await asyncio.wait({flag, task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        flag.cancel()
    if ready.is_set():
        return
    if task.done():
        task.result()  # its exception, or CancelledError when it was cancelled
        raise RuntimeError("the operator task ended before it was ready")
    raise TimeoutError(f"the operator was not ready within {timeout_s:g} s (loop clock)")


def _remove_kopf_signal_handlers() -> None:
    """kopf (``spawn_tasks``) adds loop handlers for SIGINT and SIGTERM that only set its stop flag,
    and never removes them: after an in-process operator stopped, the process ignored Ctrl-C and
    CI's SIGTERM for as long as that loop lived (a hung teardown: for good). Restore the defaults."""
    if threading.current_thread() is not threading.main_thread():
        return
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, ValueError, RuntimeError):
            loop.remove_signal_handler(sig)


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
        resp = aiohttp.web.Response(body=generate_latest(self.collectors.registry), content_type="text/plain")
        # No keep-alive: a connection's handler task would outlive the scrape, in the test's event
        # loop, where an in-process kopf operator takes every task created after its start for its
        # own and waits 5 s for them at each stop (a restart test stopped it 4 times).
        resp.force_close()
        return resp

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


# A failed operator test must cost that test, never the run (a CI run once hung for good in such a
# teardown, in pytest-asyncio's ``_cancel_all_tasks``; see tests/operator/stopping.py).
#: Real seconds one test's teardown may run its event loop before the loop is stopped (the
#: bounded stops of running_operator and its helpers, worst case, take well under this).
TEARDOWN_LIMIT_S = 120.0


def _test_loop(item: pytest.Item) -> asyncio.AbstractEventLoop | None:
    """The event loop pytest-asyncio ran ``item`` in (its runner is torn down in this teardown
    when function-scoped), found as looptime finds it: through the test's loop policy."""
    policy = getattr(item, "funcargs", {}).get("event_loop_policy")
    if policy is None:
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            loop = policy.get_event_loop()
    except RuntimeError:
        return None
    return None if loop.is_closed() else loop


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Bound the teardown: past TEARDOWN_LIMIT_S the test's loop is stopped (what it waited for
    is named, on the terminal at once and as this test's teardown error), and the run goes on."""
    loop = _test_loop(item)
    if loop is None:
        return (yield)
    terminal = item.config.pluginmanager.get_plugin("terminalreporter")
    capture = item.config.pluginmanager.get_plugin("capturemanager")

    def shout(report: str) -> None:  # on the terminal now, not in the captured teardown output
        if terminal is None:
            return
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            terminal.write_sep("!", f"{item.nodeid}: teardown stuck")
            terminal.write_line(report)

    dog = stopping.LoopWatchdog(loop, TEARDOWN_LIMIT_S, on_fire=shout)
    try:
        return (yield)
    finally:
        dog.disarm()
        if dog.report is not None:
            pytest.fail(f"teardown of {item.nodeid} {dog.report}", pytrace=False)


WAITED = "where the test waited when pytest-timeout stopped it"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """pytest-timeout's failure shows threads, not tasks: add where the test's own task waited
    (e.g. which ``wait_for``) and the other tasks pending in its loop."""
    report: pytest.TestReport = yield
    if (report.when == "call" and report.failed and call.excinfo is not None
            and "from pytest-timeout" in str(call.excinfo.value)):
        loop = _test_loop(item)
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()] if loop is not None else []
        name = getattr(item, "originalname", item.name)
        mine = [t for t in pending if getattr(t.get_coro(), "__name__", "") == name]
        if mine:
            report.sections.append((WAITED, stopping.describe(mine)))
        others = [t for t in pending if t not in mine]
        if others:
            report.sections.append(("other asyncio tasks pending at the timeout", stopping.describe(others)))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Print a failure's error on the terminal as it happens, not only in the final summary: if
    the teardown (or anything later) never ends, the log still says what failed."""
    if not report.failed or report.when not in ("setup", "call"):
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    text = f"{crash.path}:{crash.lineno}: {crash.message}" if crash is not None else str(report.longrepr)
    waited = "".join(f"\n{title}:\n{body}" for title, body in report.sections if title == WAITED)
    print(f"\n!!! {report.nodeid} failed ({report.when}): {text}{waited}", file=sys.__stderr__, flush=True)

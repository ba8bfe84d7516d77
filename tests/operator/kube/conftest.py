"""Fixtures for the real-control-plane tests: one local Kubernetes per session, the chart installed
with the real Helm SDK, and the operator run in-process with the chart's ServiceAccount token.

The control plane (:class:`ttsfleet.devtools.localkube.LocalKube`: etcd, kube-apiserver with RBAC
and OwnerReferencesPermissionEnforcement, controller-manager, scheduler, a fake kubelet) lives under
a pytest temp dir on free loopback ports and is stopped at session end. Nodes: two h200 nodes and
one rtx5090 node (4, 4 and 2 GPUs, tainted ``nvidia.com/gpu``), one b200 node (2 GPUs, a class only
a catalog file knows), one CPU node.

Two chart releases: ``ttsfleet`` (cluster-wide, namespace ``ttsfleet``) and ``tts-ns`` (namespaced:
``operator.watchNamespaces: [tts-a]``, namespace ``tts-ops``). The chart's operator Deployment is
installed with 0 replicas: the operator under test runs in the test's event loop, authenticated
as that release's ServiceAccount, so RBAC decides every call exactly as it would in the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import httpx
import pytest
from ttsfleet.devtools.localkube import FakeNode, LocalKube
from ttsfleet.devtools.wait import WaitTimeout, wait_for_async
from ttsfleet.operator.runtime import Runtime

import tests.operator.conftest as kmock_suite
from tests.kube import started
from tests.operator import stopping
from ttsfleet.catalog import GpuCatalog

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "ttsfleet"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
NODES = [
    FakeNode("h200-a", {"ttsfleet.io/gpu-class": "h200"}, gpus=4, taints=(GPU_TAINT,)),
    FakeNode("h200-b", {"ttsfleet.io/gpu-class": "h200"}, gpus=4, taints=(GPU_TAINT,)),
    FakeNode("rtx5090-a", {"ttsfleet.io/gpu-class": "rtx5090"}, gpus=2, taints=(GPU_TAINT,)),
    # a class only a catalog file knows (tests/catalogs.py: B200_YAML); the built-in one ignores it
    FakeNode("b200-a", {"ttsfleet.io/gpu-class": "b200"}, gpus=2, taints=(GPU_TAINT,)),
    FakeNode("cpu-a", {}, gpus=0),
]
RELEASES = {
    "ttsfleet": {"namespace": "ttsfleet", "values": {"operator": {"replicas": 0,
                                                                  "leaderElection": {"enabled": True}}}},
    "tts-ns": {"namespace": "tts-ops", "values": {"operator": {"replicas": 0, "watchNamespaces": ["tts-a"]},
                                                  "priorityClasses": {"create": False}}},
}


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    with started(tmp_path_factory.mktemp("kube"), NODES) as k:
        yield k


class Api:
    """The test's own view of the cluster, as the admin (async, so the operator keeps running)."""

    def __init__(self, kube: LocalKube) -> None:
        self.kube = kube
        self.client = httpx.AsyncClient(base_url=kube.url, timeout=30,
                                        verify=ssl.create_default_context(cafile=str(kube.ca_file)),
                                        headers={"Authorization": f"Bearer {kube.admin_token}"})

    async def call(self, method: str, path: str, body: Any = None, **kw: Any) -> httpx.Response:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        return await self.client.request(method, path, json=body, headers=headers, **kw)

    async def get(self, path: str) -> dict[str, Any] | None:
        r = await self.call("GET", path)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return r.json()

    async def items(self, path: str, **params: str) -> list[dict[str, Any]]:
        r = await self.call("GET", path, params=params)
        r.raise_for_status()
        return list(r.json().get("items") or [])

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.call("POST", path, body)
        assert r.status_code == 201, f"create {path}: HTTP {r.status_code} {r.text[:500]}"
        return r.json()

    async def patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.call("PATCH", path, body)
        assert r.status_code == 200, f"patch {path}: HTTP {r.status_code} {r.text[:500]}"
        return r.json()

    async def delete(self, path: str, **opts: Any) -> int:
        r = await self.call("DELETE", path, {"kind": "DeleteOptions", "apiVersion": "v1", **opts})
        return r.status_code

    async def namespace(self, name: str) -> str:
        """Create a namespace (if new) and wait for its default ServiceAccount (pods need it)."""
        r = await self.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                         "metadata": {"name": name}})
        assert r.status_code in (201, 409), r.text
        await wait_for(lambda: self.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), 60,
                       f"the default ServiceAccount in {name}")
        return name


# What a condition last saw, for the timeout message: [value] while a wait_for runs (the
# conditions below set it; they run inline in the waiting task, so they see its context).
_SEEN: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("kube_wait_seen", default=None)
_NOTHING = object()


def observed(value: Any) -> None:
    """Record what a condition saw (its timeout message shows the last one)."""
    holder = _SEEN.get()
    if holder is not None:
        holder[0] = value


def summary(value: Any, limit: int = 20) -> str:
    """Objects as ``ns/name phase node`` lines (a deleting one marked), anything else as repr."""
    def one(obj: Any) -> str:
        if not (isinstance(obj, dict) and isinstance(obj.get("metadata"), dict)):
            return repr(obj)[:300]
        meta, status, spec = obj["metadata"], obj.get("status") or {}, obj.get("spec") or {}
        where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
        bits = [f"{obj.get('kind') or ''} {where}{meta.get('name')}".strip(), str(status.get("phase") or ""),
                str(spec.get("nodeName") or ""), "deleting" if meta.get("deletionTimestamp") else ""]
        return " ".join(b for b in bits if b)
    if isinstance(value, list):
        lines = [one(v) for v in value[:limit]]
        if len(value) > limit:
            lines.append(f"... {len(value) - limit} more")
        return f"{len(value)} item(s)" + "".join(f"\n    {line}" for line in lines)
    return one(value)


async def wait_for(cond: Callable[[], Any], timeout: float = 60.0, what: str | None = None,
                   **kw: Any) -> Any:
    """:func:`ttsfleet.devtools.wait.wait_for_async` whose timeout also says what the condition
    last saw (the list :func:`exactly` / :func:`empty` got, the object :func:`gone` found, else
    the condition's last value)."""
    holder: list[Any] = [_NOTHING]
    last: list[Any] = [_NOTHING]

    def watched() -> Any:
        value = cond()
        if asyncio.iscoroutine(value):
            async def awaited() -> Any:
                last[0] = result = await value
                return result
            return awaited()
        last[0] = value
        return value
    token = _SEEN.set(holder)
    try:
        return await wait_for_async(watched, timeout, what or repr(cond), **kw)
    except WaitTimeout as exc:
        seen = holder[0] if holder[0] is not _NOTHING else last[0]
        if seen is _NOTHING:
            raise
        raise WaitTimeout(f"{exc}; last seen: {summary(seen)}") from None
    finally:
        _SEEN.reset(token)


# Conditions for wait_for, shared by the e2e modules.
async def gone(api: Api, path: str) -> bool:
    """True once ``path`` is not found (deleted and its finalizers done)."""
    obj = await api.get(path)
    observed(obj)
    return obj is None


async def exactly(found: Awaitable[list[Any]], n: int) -> list[Any] | None:
    """The awaited list when it holds exactly ``n`` items, else None (keep waiting)."""
    items = await found
    observed(items)
    return items if len(items) == n else None


async def empty(found: Awaitable[list[Any]]) -> bool:
    """True once the awaited list is empty."""
    items = await found
    observed(items)
    return not items


async def bound_claim(api: Api, ns: str, name: str = "ckpt") -> None:
    """A bound ReadWriteMany claim (a hostPath PV pre-bound to it; the PV controller binds)."""
    await api.create("/api/v1/persistentvolumes", {
        "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{ns}-{name}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"],
                 "hostPath": {"path": f"/tmp/{ns}-{name}"}, "storageClassName": "",
                 "claimRef": {"namespace": ns, "name": name}}})
    await api.create(f"/api/v1/namespaces/{ns}/persistentvolumeclaims", {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{ns}-{name}",
                 "resources": {"requests": {"storage": "1Gi"}}}})

    async def bound() -> bool:
        pvc = await api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}") or {}
        return (pvc.get("status") or {}).get("phase") == "Bound"
    await wait_for(bound, 60, f"PVC {ns}/{name} Bound")


@pytest.fixture
async def api(kube: LocalKube) -> AsyncIterator[Api]:
    a = Api(kube)
    yield a
    await a.client.aclose()


def install(kube: LocalKube, release: str) -> dict[str, Any]:
    """``helm install RELEASE charts/ttsfleet -n NS --create-namespace`` through the Helm SDK."""
    spec = RELEASES[release]
    with helm.Config(kubeconfig_path=str(kube.admin_kubeconfig), namespace=spec["namespace"]) as cfg, \
            helm.Chart.load(CHART) as chart:
        return cfg.install(chart, release, spec["values"], namespace=spec["namespace"],
                           create_namespace=True, wait="watcher", timeout=120)


def uninstall(kube: LocalKube, release: str) -> dict[str, Any]:
    spec = RELEASES[release]
    with helm.Config(kubeconfig_path=str(kube.admin_kubeconfig), namespace=spec["namespace"]) as cfg:
        return cfg.uninstall(release, wait="watcher", timeout=120)


@pytest.fixture(scope="session")
def releases(kube: LocalKube) -> dict[str, dict[str, Any]]:
    """Both chart releases installed once (CRDs from the chart's crds/ on the first). The watched
    namespaces must exist first: the chart puts a Role into each."""
    for ns in ("tts-a",):
        code, body = kube.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                                "metadata": {"name": ns}})
        assert code in (201, 409), body
    return {name: install(kube, name) for name in RELEASES}


def operator_kubeconfig(kube: LocalKube, release: str, path: Path) -> Path:
    """A kubeconfig holding a real token of the release's ServiceAccount (TokenRequest)."""
    ns = RELEASES[release]["namespace"]
    sa = release if "ttsfleet" in release else f"{release}-ttsfleet"  # the chart's fullname
    return kube.write_kubeconfig(path, kube.service_account_token(ns, sa), f"system:serviceaccount:{ns}:{sa}")


@contextlib.asynccontextmanager
async def running_operator(kube: LocalKube, release: str, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch, **rt_kw: Any) -> AsyncIterator[Runtime]:
    """The real operator wiring in this event loop, as the release's ServiceAccount."""
    cfg = operator_kubeconfig(kube, release, tmp_path / f"{release}.kubeconfig")
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("TTSFLEET_PROMETHEUS_URL", raising=False)
    # 1 s autoscaler passes: the tests' quiet windows are counted in passes (3 * autoscale_interval_s)
    rt_kw.setdefault("autoscale_interval_s", 1.0)
    rt_kw.setdefault("fill_interval_s", 2.0)
    rt_kw.setdefault("retry_delay_s", 2.0)
    rt_kw.setdefault("catalog", GpuCatalog.default())  # the tests' entry point: the built-in catalog
    rt = Runtime.from_environment(**rt_kw)
    namespaces = tuple(RELEASES[release]["values"]["operator"].get("watchNamespaces", ()))
    failing: BaseException | None = None
    try:
        async with kmock_suite.running_operator(rt, namespaces) as running:
            yield running
    except BaseException as exc:
        failing = exc
        raise
    finally:
        # In a task of its own and bounded: ClusterCache.aclose awaits its cancelled informers
        # under suppress(CancelledError), which would swallow a cancellation of this task.
        try:
            await stopping.run_bounded(rt.aclose, "Runtime.aclose()", timeout_s=15.0, cancel_s=5.0)
        except Exception as problem:
            stopping.note(failing, problem)

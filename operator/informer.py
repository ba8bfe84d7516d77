"""Watch-fed caches of the pods and nodes the controllers observe (no re-LIST every pass).

An :class:`Informer` LISTs a collection once, in pages, then WATCHes it from the list's
``resourceVersion`` (bookmarks on, label and field selectors on the server), and LISTs again only
when the server answers 410 Gone. It keeps a compact projection of each object (:func:`prune`
with :data:`POD_SHAPE` / :data:`NODE_SHAPE`: the fields the observe steps read), so memory is
O(objects × a few hundred bytes) instead of full objects, and a steady state sends no LIST.

:class:`ClusterCache` is the observation source the fill controller, the GPU inventory and the
autoscaler read (``rt.cluster``): the GPU nodes, every unfinished pod cluster-wide (the GPU
picture), and the fill pods (finished ones too: their exit codes are the shard accounting). The
selections are also checked client-side, so a server that ignores selectors (kmock) gives the
same view. The policy never sees this module: it gets the same plain dicts a LIST gave.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.desired import L_INSTANCE
from ttsfleet.operator.kube import Kube, KubeError, path

log = logging.getLogger(__name__)

KEEP = True
#: What a pod keeps: names and labels, where it runs, what it holds, how it ends, how to scrape it.
POD_SHAPE: dict[str, Any] = {
    "metadata": {"name": KEEP, "namespace": KEEP, "uid": KEEP, "resourceVersion": KEEP,
                 "labels": KEEP, "annotations": KEEP, "deletionTimestamp": KEEP},
    "spec": {"nodeName": KEEP, "nodeSelector": KEEP, "priorityClassName": KEEP,
             "terminationGracePeriodSeconds": KEEP,
             "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": KEEP}},
             "containers": [{"name": KEEP, "resources": KEEP, "ports": KEEP}]},
    "status": {"phase": KEEP, "podIP": KEEP, "startTime": KEEP,
               # how a fill pod ended: its exit code, and its last checkpoint (the termination message)
               "containerStatuses": [{"state": {"terminated": {"exitCode": KEEP, "message": KEEP,
                                                               "startedAt": KEEP, "finishedAt": KEEP}}}]},
}
#: What a node keeps: its class label, GPU capacity, and whether it can run pods.
NODE_SHAPE: dict[str, Any] = {
    "metadata": {"name": KEEP, "resourceVersion": KEEP, "labels": KEEP},
    "spec": {"unschedulable": KEEP},
    "status": {"allocatable": KEEP, "capacity": KEEP, "conditions": [{"type": KEEP, "status": KEEP}]},
}
#: Pod annotations the observe steps read (kubectl's last-applied and the like are dropped).
ANNOTATION_PREFIXES = ("ttsfleet.io/", "controller.kubernetes.io/pod-deletion-cost")


def prune(obj: Any, shape: Any) -> Any:
    """The parts of ``obj`` named by ``shape`` (a nested dict; a one-element list shapes every
    item of a list; ``KEEP`` keeps a value whole). Keys absent from ``obj`` stay absent."""
    if shape is KEEP:
        return obj
    if isinstance(shape, list):
        return [prune(x, shape[0]) for x in obj] if isinstance(obj, list) else obj
    if not isinstance(obj, Mapping):
        return obj
    return {k: prune(obj[k], sub) for k, sub in shape.items() if k in obj}


def project_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    out = prune(pod, POD_SHAPE)
    ann = out.get("metadata", {}).get("annotations")
    if ann is not None:
        out["metadata"]["annotations"] = {k: v for k, v in ann.items() if k.startswith(ANNOTATION_PREFIXES)}
    return out


def project_node(node: Mapping[str, Any]) -> dict[str, Any]:
    return prune(node, NODE_SHAPE)


def compact(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fresh copies of projections made from one parsed LIST page. A projection shares its
    strings with the page's parse; kept alive, they pin the allocator's arenas of the whole page
    (a full object is ~20x its projection), so RSS would stay at the page's high-water mark."""
    return list(json.loads(json.dumps(objs)))


def key_of(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


class CacheNotReady(RuntimeError):
    """The first LIST has not succeeded yet (the pass fails as a failed LIST did)."""


@dataclass
class Informer:
    """One collection, listed once and then watched; :attr:`items` holds the projections."""

    kube: Kube
    url: str
    labels: str | None = None
    fields: str | None = None
    keep: Callable[[Mapping[str, Any]], bool] = lambda _: True
    project: Callable[[Mapping[str, Any]], dict[str, Any]] = dict
    page_size: int = 500
    watch_timeout_s: int = 300
    retry_s: float = 2.0
    items: dict[str, dict[str, Any]] = field(default_factory=dict)
    resource_version: str = ""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    last_error: str = ""
    lists: int = 0  # LIST rounds (the first one, then one per 410 Gone)
    watches: int = 0  # WATCH requests

    async def run(self) -> None:
        """LIST, then WATCH for ever; LIST again on 410 Gone, retry after other errors."""
        while True:
            try:
                await self.relist()
                while True:
                    await self.watch_once()
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                self._failed(exc)
                if exc.status != 410:
                    await asyncio.sleep(self.retry_s)
            except (httpx.HTTPError, ValueError) as exc:
                self._failed(exc)
                await asyncio.sleep(self.retry_s)

    def _failed(self, exc: Exception) -> None:
        self.last_error = repr(exc)
        log.warning("%s: %s; listing again", self.url, self.last_error)

    async def relist(self) -> None:
        fresh: dict[str, dict[str, Any]] = {}
        rv = ""
        async for page in self.kube.list_pages(self.url, labels=self.labels, fields=self.fields,
                                               limit=self.page_size):
            kept = [self.project(obj) for obj in page.get("items") or [] if self.keep(obj)]
            for obj in compact(kept):
                fresh[key_of(obj)] = obj
            rv = str((page.get("metadata") or {}).get("resourceVersion") or rv)
        self.items, self.resource_version = fresh, rv
        self.lists += 1
        self.synced.set()

    async def watch_once(self) -> None:
        """One WATCH until the server ends it; events move :attr:`resource_version` forward."""
        self.watches += 1
        try:
            async for event in self.kube.watch(self.url, self.resource_version, labels=self.labels,
                                               fields=self.fields, timeout_s=self.watch_timeout_s):
                self.apply(event)
        except httpx.ReadTimeout:
            return  # a quiet server that ignores timeoutSeconds: watch again from the same point

    def apply(self, event: Mapping[str, Any]) -> None:
        obj = event.get("object") or {}
        rv = (obj.get("metadata") or {}).get("resourceVersion")
        kind = event.get("type")
        if kind in ("ADDED", "MODIFIED"):
            if self.keep(obj):
                self.items[key_of(obj)] = self.project(obj)
            else:  # left the selection (a server that does not filter)
                self.items.pop(key_of(obj), None)
        elif kind == "DELETED":  # deleted, or left the server-side selection (a pod that finished)
            self.items.pop(key_of(obj), None)
        if rv:
            self.resource_version = str(rv)

    def created(self, obj: Mapping[str, Any]) -> None:
        """An object this process just created: seen at once, before its watch event arrives
        (the next pass must not admit onto the same GPU). The watch event replaces it."""
        if self.keep(obj) and key_of(obj) not in self.items:
            self.items[key_of(obj)] = self.project(obj)

    async def ready(self, timeout_s: float) -> None:
        try:
            await asyncio.wait_for(self.synced.wait(), timeout_s)
        except TimeoutError:
            raise CacheNotReady(f"{self.url}: not listed yet ({self.last_error or 'no answer'})") from None

    def values(self) -> list[dict[str, Any]]:
        return list(self.items.values())


class ClusterView(Protocol):
    """What the controllers observe (the watch cache here; a LIST per call in the benchmark)."""

    async def gpu_nodes(self) -> list[dict[str, Any]]: ...
    async def gpu_pods(self) -> list[dict[str, Any]]: ...
    async def fill_pods(self, namespace: str, job: str) -> list[dict[str, Any]]: ...
    async def instance_pods(self, namespace: str, instance: str) -> list[dict[str, Any]]: ...
    def created(self, pod: Mapping[str, Any]) -> None: ...
    def start(self) -> None: ...
    def requests(self) -> dict[str, int]: ...
    async def aclose(self) -> None: ...


def _has_class_label(node: Mapping[str, Any]) -> bool:
    return fv.NODE_SELECTOR in ((node.get("metadata") or {}).get("labels") or {})


def _is_fill_pod(pod: Mapping[str, Any]) -> bool:
    return fv.L_FILLJOB in ((pod.get("metadata") or {}).get("labels") or {})


@dataclass
class ClusterCache:
    """The three informers the controllers share, started with the operator, stopped with it."""

    kube: Kube
    sync_timeout_s: float = 30.0
    watch_timeout_s: int = 300
    informers: dict[str, Informer] = field(init=False)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        pods = path("v1", "pods")
        self.informers = {
            "nodes": Informer(self.kube, path("v1", "nodes"), labels=fv.NODE_SELECTOR,
                              keep=_has_class_label, project=project_node,
                              watch_timeout_s=self.watch_timeout_s),
            "pods": Informer(self.kube, pods, fields=fv.UNFINISHED, keep=lambda p: not fv.finished(p),
                             project=project_pod, watch_timeout_s=self.watch_timeout_s),
            "fill": Informer(self.kube, pods, labels=fv.L_FILLJOB, keep=_is_fill_pod,
                             project=project_pod, watch_timeout_s=self.watch_timeout_s),
        }

    def start(self) -> None:
        """Start the informers (idempotent; needs the running event loop)."""
        if not self.tasks:
            self.tasks = [asyncio.create_task(i.run(), name=f"informer {name}")
                          for name, i in self.informers.items()]

    async def _ready(self, name: str) -> Informer:
        self.start()
        informer = self.informers[name]
        await informer.ready(self.sync_timeout_s)
        return informer

    async def gpu_nodes(self) -> list[dict[str, Any]]:
        return (await self._ready("nodes")).values()

    async def gpu_pods(self) -> list[dict[str, Any]]:
        """Every unfinished pod, cluster-wide: whatever may hold a GPU."""
        return (await self._ready("pods")).values()

    async def fill_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """One FillJob's pods, finished ones included."""
        return fv.own_pods((await self._ready("fill")).values(), namespace, job)  # type: ignore[return-value]

    async def instance_pods(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        """One TTSDeployment's unfinished pods (the autoscaler counts only Running ones)."""
        return [p for p in (await self._ready("pods")).values()
                if p["metadata"].get("namespace") == namespace
                and (p["metadata"].get("labels") or {}).get(L_INSTANCE) == instance]

    def created(self, pod: Mapping[str, Any]) -> None:
        for name in ("pods", "fill"):
            self.informers[name].created(pod)

    def requests(self) -> dict[str, int]:
        """LIST rounds and WATCH requests so far, per informer (tests, benchmark)."""
        return {f"{n}_{k}": getattr(i, k) for n, i in self.informers.items() for k in ("lists", "watches")}

    async def aclose(self) -> None:
        """Cancel the informers and wait for them; their own ends (cancelled, or an error) are
        collected, but a cancellation of the caller propagates at once, even past an informer slow
        to stop (a suppress around each await swallowed it, and a test runner cancelling this task
        then waited on it forever)."""
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            done, _ = await asyncio.wait(self.tasks)  # a cancelled caller stops waiting at once
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: an informer's own end is not the closer's error
        self.tasks = []

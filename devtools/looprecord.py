"""What happened in the cluster during a loop run, recorded from the API as it happened.

:class:`ClusterRecorder` watches the pods and Events of the run's namespace and samples the pools'
Deployments once a second; it keeps

* every pod's life (:class:`PodLife`): when it was created, bound, Running, Ready, asked to stop
  (with the ``pod-deletion-cost`` it carried then), its exit code;
* the replicas per pool over time (desired from the Deployment, ready from the pods);
* fill pods running per GPU class over time, and the fill and scheduling Events
  (``FillAdmitted``, ``FillEvicted``, ``Preempted``).

Times are seconds on the recorder's clock (the monotonic clock, 0 at :meth:`start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
L_WORKLOAD, L_POOL, L_CLASS, L_SHARD = ("ttsfleet.io/workload", "ttsfleet.io/pool", "ttsfleet.io/gpu-class",
                                        "ttsfleet.io/shard")
EVENT_REASONS = ("FillAdmitted", "FillEvicted", "Preempted", "Killing", "Unhealthy", "BackOff")


@dataclass
class PodLife:
    name: str
    workload: str
    pool: str = ""
    gpu_class: str = ""
    shard: str = ""
    node: str = ""
    created_s: float = 0.0
    running_s: float | None = None
    ready_s: float | None = None
    unready_s: float | None = None  # Ready went False after it had been True
    deleting_s: float | None = None
    deletion_cost: int | None = None  # at the moment its deletion was seen
    costs_at_deletion: dict[str, int] = field(default_factory=dict)  # the pool's other pods then
    exit_code: int | None = None
    gone_s: float | None = None


@dataclass
class Sample:
    t: float
    desired: dict[str, int]
    ready: dict[str, int]
    fill_running: dict[str, int]
    #: What the servers' own /metrics said (what the operator's autoscaler reads): requests in
    #: flight + queued per pool, and the p99 time to first audio of the requests since the last
    #: sample (None: no request finished its first audio in between).
    server_load: dict[str, float] = field(default_factory=dict)
    server_ttfa_p99: dict[str, float | None] = field(default_factory=dict)
    pod_load: dict[str, tuple[float, float]] = field(default_factory=dict)  # pod -> (in flight, queued)
    fill_items_done: int = 0  # committed items over the job's checkpoints


@dataclass
class EventRecord:
    t: float
    reason: str
    object: str
    message: str


def _ready(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _exit(pod: Mapping[str, Any]) -> int | None:
    for c in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (c.get("state") or {}).get("terminated")
        if term:
            return int(term["exitCode"])
    return None


class ClusterRecorder:
    """Watches one namespace (pods, Events) and samples its Deployments every ``period_s``."""

    def __init__(self, api: httpx.AsyncClient, namespace: str, period_s: float = 1.0,
                 checkpoints: Path | None = None) -> None:
        self.api, self.namespace, self.period_s, self.checkpoints = api, namespace, period_s, checkpoints
        self.t0 = time.monotonic()
        self.pods: dict[str, PodLife] = {}  # by uid
        self.live: dict[str, dict[str, Any]] = {}  # uid -> latest object
        self.samples: list[Sample] = []
        self.events: list[EventRecord] = []
        self._seen_events: set[str] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.http = httpx.AsyncClient()
        self._ttfa: dict[str, tuple[tuple[float, float], ...]] = {}

    def now(self) -> float:
        return round(time.monotonic() - self.t0, 2)

    # --- pods -------------------------------------------------------------------------------
    def _fold_pod(self, kind: str, pod: dict[str, Any]) -> None:
        meta, t = pod["metadata"], self.now()
        uid, labels = meta["uid"], meta.get("labels") or {}
        life = self.pods.get(uid)
        if life is None:
            life = self.pods[uid] = PodLife(meta["name"], labels.get(L_WORKLOAD, "other"),
                                            labels.get(L_POOL, ""), labels.get(L_CLASS, ""),
                                            labels.get(L_SHARD, ""), created_s=t)
        if kind == "DELETED":
            life.gone_s = t
            self.live.pop(uid, None)
            return
        self.live[uid] = pod
        life.node = (pod.get("spec") or {}).get("nodeName") or life.node
        if (pod.get("status") or {}).get("phase") == "Running" and life.running_s is None:
            life.running_s = t
        if _ready(pod) and life.ready_s is None:
            life.ready_s = t
        elif not _ready(pod) and life.ready_s is not None and life.unready_s is None:
            life.unready_s = t
        if meta.get("deletionTimestamp") and life.deleting_s is None:
            life.deleting_s = t
            life.deletion_cost = _cost(pod)
            life.costs_at_deletion = {
                p["metadata"]["name"]: _cost(p) for u, p in self.live.items()
                if u != uid and (p["metadata"].get("labels") or {}).get(L_POOL) == life.pool and life.pool
                and not p["metadata"].get("deletionTimestamp")}
        code = _exit(pod)
        if code is not None:
            life.exit_code = code

    async def _watch(self, resource: str, fold: Any) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/{resource}"
        while True:
            try:
                r = await self.api.get(path)
                r.raise_for_status()
                body = r.json()
                for item in body.get("items") or []:
                    fold("ADDED", item)
                params = {"watch": "1", "resourceVersion": body["metadata"]["resourceVersion"],
                          "timeoutSeconds": "60"}
                async with self.api.stream("GET", path, params=params, timeout=None) as resp:
                    async for line in resp.aiter_lines():
                        if line:
                            ev = json.loads(line)
                            if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                                fold(ev["type"], ev["object"])
            except (httpx.HTTPError, ValueError, KeyError):
                await asyncio.sleep(0.5)

    # --- events -----------------------------------------------------------------------------
    def _fold_event(self, kind: str, ev: dict[str, Any]) -> None:
        uid = ev["metadata"]["uid"]
        if kind == "DELETED" or uid in self._seen_events or ev.get("reason") not in EVENT_REASONS:
            return
        self._seen_events.add(uid)
        obj = ev.get("involvedObject") or {}
        self.events.append(EventRecord(self.now(), ev["reason"], f"{obj.get('kind')}/{obj.get('name')}",
                                       str(ev.get("message", ""))[:300]))

    # --- samples ----------------------------------------------------------------------------
    async def _sample(self) -> None:
        path = f"/apis/apps/v1/namespaces/{self.namespace}/deployments"
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                r = await self.api.get(path, params={"labelSelector": L_POOL})
                r.raise_for_status()
                desired = {d["metadata"]["labels"][L_POOL]: int(d["spec"].get("replicas") or 0)
                           for d in r.json().get("items") or []}
                ready: dict[str, int] = dict.fromkeys(desired, 0)
                fill: dict[str, int] = {}
                for pod in self.live.values():
                    labels = pod["metadata"].get("labels") or {}
                    if labels.get(L_WORKLOAD) == "inference" and _ready(pod):
                        ready[labels.get(L_POOL, "")] = ready.get(labels.get(L_POOL, ""), 0) + 1
                    if (labels.get(L_WORKLOAD) == "fill" and not pod["metadata"].get("deletionTimestamp")
                            and (pod.get("status") or {}).get("phase") == "Running"):
                        fill[labels.get(L_CLASS, "")] = fill.get(labels.get(L_CLASS, ""), 0) + 1
                load, p99, per_pod = await self._scrape()
                self.samples.append(Sample(self.now(), desired, ready, fill, load, p99, per_pod,
                                           self._items_done()))
            await asyncio.sleep(self.period_s)

    def _items_done(self) -> int:
        """Committed fill items, read from the job's checkpoint files (the fill job's own record)."""
        if self.checkpoints is None or not self.checkpoints.is_dir():
            return 0
        from ttsfleet.fill_jobs.checkpoint import load_all

        with contextlib.suppress(OSError, ValueError):
            return sum(c.items_done for c in load_all(self.checkpoints))
        return 0

    async def _scrape(self) -> tuple[dict[str, float], dict[str, float | None],
                                     dict[str, tuple[float, float]]]:
        """Each Running inference pod's /metrics, summed per pool (the contract's metric names)."""
        from ttsfleet.operator.signals import bucket_delta, histogram_quantile, parse_metrics, pod_url

        load: dict[str, float] = {}
        per_pod: dict[str, tuple[float, float]] = {}
        buckets: dict[str, dict[float, float]] = {}
        for pod in list(self.live.values()):
            labels = pod["metadata"].get("labels") or {}
            url = pod_url(pod)
            if labels.get(L_WORKLOAD) != "inference" or not url:
                continue
            try:
                r = await self.http.get(url, timeout=2.0)
                r.raise_for_status()
            except httpx.HTTPError:
                continue
            sample = parse_metrics(r.text)
            pool, name = labels.get(L_POOL, ""), pod["metadata"]["name"]
            load[pool] = load.get(pool, 0.0) + sample.in_flight + sample.queue_depth
            per_pod[name] = (sample.in_flight, sample.queue_depth)
            merged = buckets.setdefault(pool, {})
            for le, c in bucket_delta(sample.ttfa_buckets, self._ttfa.get(name)):
                merged[le] = merged.get(le, 0.0) + c
            self._ttfa[name] = sample.ttfa_buckets
        return load, {p: histogram_quantile(0.99, sorted(b.items())) for p, b in buckets.items()}, per_pod

    # --- lifecycle --------------------------------------------------------------------------
    def start(self) -> ClusterRecorder:
        self.t0 = time.monotonic()
        self._tasks = [asyncio.create_task(self._watch("pods", self._fold_pod)),
                       asyncio.create_task(self._watch("events", self._fold_event)),
                       asyncio.create_task(self._sample())]
        return self

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await self.http.aclose()

    def to_dict(self) -> dict[str, Any]:
        return {"pods": [asdict(p) for p in self.pods.values()], "samples": [asdict(s) for s in self.samples],
                "events": [asdict(e) for e in self.events]}


def _cost(pod: Mapping[str, Any]) -> int | None:
    value = (pod["metadata"].get("annotations") or {}).get(DELETION_COST)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None

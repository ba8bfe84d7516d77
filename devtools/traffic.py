"""Traffic against a Service of the local control plane, measured at the client.

Three parts, all small:

* :class:`ServiceEndpoints` — the client-side half of kube-proxy: the Service's ready endpoints
  (its selector's pods that are Ready and not terminating, from a watch), handed out
  round-robin (kube-proxy's IPVS default), so traffic follows the servers' own readiness probes
  and leaves a pod the moment its deletion starts, before its preStop hook ends;
* :func:`replay` — open loop: arrivals are drawn from a trace (``ttsfleet.sim.trace`` format:
  requests/s and frames per request by second; Poisson, seeded) and every request starts at its
  time whether or not earlier ones finished, so a slow fleet sees the queue grow instead of
  the load shrinking. Each request is a streaming ``POST /v1/tts``; the record keeps the pod it
  went to, the HTTP status, the time to the first audio bytes and whether the stream ended
  cleanly (a reset or a cut stream is a dropped request);
* :func:`closed_loop` — a fixed number of clients, each sending its next request as soon as the
  last one ends, so exactly that many requests are in flight however fast the servers are. An
  open-loop rate gives a load (rate x request time) that shrinks on a faster machine; a test
  that needs "load above the autoscaler's target" on any machine holds it with this.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import httpx

from ttsfleet.sim.trace import Trace

TEXTS = ("The river runs quietly past the old mill.", "Good morning, your table is ready.",
         "Please mind the gap between the train and the platform.", "The forecast says rain later.")


@dataclass(frozen=True)
class Endpoint:
    pod: str
    address: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class RequestRecord:
    """One request as the client saw it (times in seconds from the replay's start)."""

    index: int
    sent_s: float
    pod: str = ""
    status: int = 0
    ttfa_s: float | None = None
    duration_s: float = 0.0
    audio_bytes: int = 0
    frames_asked: int = 0
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error and self.audio_bytes > 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ServiceEndpoints:
    """The ready endpoints of one Service: its selector's pods that are Ready and not terminating.

    That is the endpointslice controller's rule (an endpoint is ready when its pod is Ready and
    has no deletionTimestamp), applied here to a watch on the pods because the API server refuses
    EndpointSlice addresses in 127.0.0.0/8 and every pod of the process kubelet lives there. The
    Service's selector and target port are read from the Service the operator made.
    """

    def __init__(self, api: httpx.AsyncClient, namespace: str, service: str) -> None:
        self.api, self.namespace, self.service = api, namespace, service
        self.pods: dict[str, dict[str, Any]] = {}
        self.selector = ""
        self.target_port: int | str = 0
        self._next = 0
        self._task: asyncio.Task[None] | None = None

    def ready(self) -> list[Endpoint]:
        out = []
        for pod in self.pods.values():
            ip = (pod.get("status") or {}).get("podIP")
            conds = (pod.get("status") or {}).get("conditions") or []
            if not ip or pod["metadata"].get("deletionTimestamp") or not any(
                    c["type"] == "Ready" and c["status"] == "True" for c in conds):
                continue
            port = _port(pod, self.target_port)
            if port:
                out.append(Endpoint(pod["metadata"]["name"], ip, port))
        return sorted(out, key=lambda e: e.pod)

    def pick(self) -> Endpoint | None:
        eps = self.ready()
        if not eps:
            return None
        self._next = (self._next + 1) % len(eps)
        return eps[self._next]

    def _fold(self, kind: str, pod: dict[str, Any]) -> None:
        if kind == "DELETED":
            self.pods.pop(pod["metadata"]["uid"], None)
        else:
            self.pods[pod["metadata"]["uid"]] = pod

    async def _resolve(self) -> None:
        r = await self.api.get(f"/api/v1/namespaces/{self.namespace}/services/{self.service}")
        r.raise_for_status()
        spec = r.json()["spec"]
        self.selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
        port = (spec.get("ports") or [{}])[0]
        self.target_port = port.get("targetPort", port.get("port", 0))

    async def _watch(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while True:
            try:
                if not self.selector:
                    await self._resolve()
                r = await self.api.get(path, params={"labelSelector": self.selector})
                r.raise_for_status()
                body = r.json()
                self.pods = {}
                for item in body.get("items") or []:
                    self._fold("ADDED", item)
                params = {"labelSelector": self.selector, "watch": "1", "timeoutSeconds": "60",
                          "resourceVersion": body["metadata"]["resourceVersion"]}
                async with self.api.stream("GET", path, params=params, timeout=None) as resp:
                    async for line in resp.aiter_lines():
                        if line:
                            ev = json.loads(line)
                            if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                                self._fold(ev["type"], ev["object"])
            except (httpx.HTTPError, ValueError, KeyError):
                await asyncio.sleep(0.5)

    async def __aenter__(self) -> ServiceEndpoints:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def _port(pod: dict[str, Any], target: int | str) -> int | None:
    """A Service's targetPort on one pod: a number, or the name of one of its container ports."""
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == target:
                return int(p["containerPort"])
    return None


def arrivals(trace: Trace, seed: int = 0, duration_s: float | None = None) -> list[tuple[float, int]]:
    """(time, frames) of every request: Poisson arrivals per second of the trace, seeded."""
    rng = random.Random(seed)
    end = len(trace.rate) if duration_s is None else min(len(trace.rate), int(duration_s))
    out: list[tuple[float, int]] = []
    for second in range(end):
        rate = float(trace.rate[second])
        t = float(second) + rng.expovariate(rate) if rate > 0 else second + 1.0
        while t < second + 1:
            out.append((t, max(1, round(float(trace.mean_frames[second])))))
            t += rng.expovariate(rate)
    return out


async def one_request(client: httpx.AsyncClient, endpoints: ServiceEndpoints, rec: RequestRecord,
                      seed: int) -> RequestRecord:
    """Send one streaming request to the next ready endpoint and fill ``rec`` in."""
    ep = endpoints.pick()
    start = time.monotonic()
    if ep is None:
        rec.error = "no ready endpoint"
        return rec
    rec.pod = ep.pod
    body = {"text": TEXTS[rec.index % len(TEXTS)], "format": "pcm", "streaming": True, "latency": "low",
            "max_new_tokens": rec.frames_asked, "seed": seed + rec.index}
    try:
        async with client.stream("POST", f"{ep.url}/v1/tts", json=body) as resp:
            rec.status = resp.status_code
            async for chunk in resp.aiter_bytes():
                if chunk and rec.ttfa_s is None:
                    rec.ttfa_s = time.monotonic() - start
                rec.audio_bytes += len(chunk)
            if resp.status_code != 200:
                rec.error = f"HTTP {resp.status_code}"
    except httpx.HTTPError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:200]
    rec.duration_s = time.monotonic() - start
    return rec


async def replay(endpoints: ServiceEndpoints, schedule: Sequence[tuple[float, int]], seed: int = 0,
                 timeout_s: float = 120.0) -> list[RequestRecord]:
    """Start every request of ``schedule`` at its time (open loop); return them all when done."""
    limits = httpx.Limits(max_connections=512, max_keepalive_connections=0)
    records = [RequestRecord(i, t, frames_asked=f) for i, (t, f) in enumerate(schedule)]
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t0 = time.monotonic()
        tasks = []
        for rec in records:
            delay = t0 + rec.sent_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            rec.sent_s = time.monotonic() - t0
            tasks.append(asyncio.create_task(one_request(client, endpoints, rec, seed)))
        await asyncio.gather(*tasks)
    return records


async def closed_loop(endpoints: ServiceEndpoints, clients: int, keep_going: Callable[[], bool], frames: int,
                      clock: Callable[[], float], seed: int = 0, first_index: int = 0,
                      timeout_s: float = 120.0) -> list[RequestRecord]:
    """``clients`` streams of back-to-back requests of ``frames`` frames while ``keep_going()``; every
    request's record (``sent_s`` on ``clock``, indices from ``first_index``) once all have ended."""
    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=0)

    async def client_loop(client: httpx.AsyncClient) -> None:
        while keep_going():
            rec = RequestRecord(first_index + len(records), clock(), frames_asked=frames)
            records.append(rec)
            await one_request(client, endpoints, rec, seed)
            if rec.error == "no ready endpoint":
                await asyncio.sleep(0.2)  # not a busy loop while the Service has no endpoint

    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    return records


def admin_client(server: str, ca_file: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=server, timeout=30, verify=ssl.create_default_context(cafile=ca_file),
                             headers={"Authorization": f"Bearer {token}"})

"""One operator process for bench_watch_memory.py: the real wiring, in one observation mode.

``--mode watch``: the operator as shipped (operator/informer.py: list once, then watch).
``--mode list``: the path before 2026-12-01, kept only here as the comparison: every pass LISTs
the nodes and pods it reads, one unpaginated GET per call, exactly the calls the old
``fill.observe`` / ``inventory_pass`` / ``autoscale`` made (:class:`ListEveryPass`).

The API client's transport counts requests (by verb and resource) and the bytes received per
second; they are written to ``--result`` as JSON when the run ends (``--duration`` seconds).
The parent samples this process's RSS from /proc.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.desired import L_INSTANCE
from ttsfleet.operator.informer import ClusterCache
from ttsfleet.operator.kube import Kube, path
from ttsfleet.operator.main import operator_task
from ttsfleet.operator.runtime import Runtime


class ListEveryPass:
    """The old observation path: a full LIST per call, nothing kept between passes."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    async def _list(self, url: str, labels: str | None = None,
                    fields: str | None = None) -> list[dict[str, Any]]:
        params = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        resp = await self.kube._request("GET", url, params=params)  # one GET, no limit: as before
        return list(self.kube._check(resp).get("items") or [])

    async def gpu_nodes(self) -> list[dict[str, Any]]:
        return await self._list(path("v1", "nodes"), labels=fv.NODE_SELECTOR)

    async def gpu_pods(self) -> list[dict[str, Any]]:
        return await self._list(path("v1", "pods"), fields=fv.UNFINISHED)

    async def fill_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return await self._list(path("v1", "pods", namespace), labels=f"{fv.L_FILLJOB}={job}")

    async def instance_pods(self, namespace: str, instance: str) -> list[dict[str, Any]]:
        return await self._list(path("v1", "pods", namespace), labels=f"{L_INSTANCE}={instance}")

    def created(self, pod: Mapping[str, Any]) -> None:
        pass

    def start(self) -> None:
        pass

    def requests(self) -> dict[str, int]:
        return {}

    async def aclose(self) -> None:
        pass


class CountingStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, meter: Meter) -> None:
        self.inner, self.meter = inner, meter

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.meter.received(len(chunk))
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class Meter(httpx.AsyncBaseTransport):
    """Counts each request (verb, resource) and the response bytes per second of the run."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner, self.t0 = inner, time.monotonic()
        self.requests: list[tuple[float, str, str]] = []
        self.bytes_per_s: Counter[int] = Counter()

    def received(self, n: int) -> None:
        self.bytes_per_s[int(time.monotonic() - self.t0)] += n

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        parts = request.url.path.strip("/").split("/")
        resource = next((p for p in ("pods", "nodes", "deployments", "events", "services",
                                     "poddisruptionbudgets") if p in parts), "other")
        verb = {"GET": "watch" if request.url.params.get("watch") else "get", "POST": "create",
                "PATCH": "patch", "DELETE": "delete"}.get(request.method, request.method)
        if verb == "get" and parts[-1] == resource:
            verb = "list"
        self.requests.append((time.monotonic() - self.t0, verb, resource))
        resp = await self.inner.handle_async_request(request)
        resp.stream = CountingStream(resp.stream, self)  # type: ignore[arg-type]
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


def counted_kube(kubeconfig: Path) -> tuple[Kube, Meter]:
    cfg = json.loads(kubeconfig.read_text())
    cluster, user = cfg["clusters"][0]["cluster"], cfg["users"][0]["user"]
    verify = ssl.create_default_context(cafile=cluster["certificate-authority"])
    meter = Meter(httpx.AsyncHTTPTransport(verify=verify))
    client = httpx.AsyncClient(base_url=cluster["server"], transport=meter, timeout=60,
                               headers={"Authorization": f"Bearer {user['token']}"})
    return Kube(client), meter


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def main(args: argparse.Namespace) -> None:
    kube, meter = counted_kube(args.kubeconfig)
    view = ClusterCache(kube) if args.mode == "watch" else ListEveryPass(kube)
    rt = Runtime(kube=kube, http=httpx.AsyncClient(timeout=5), cluster=view,
                 fill_interval_s=args.fill_interval, autoscale_interval_s=args.autoscale_interval)
    baseline = rss_mib()  # everything imported, nothing observed yet
    stop = asyncio.Event()
    task = asyncio.create_task(operator_task(rt, stop_flag=stop))
    await asyncio.sleep(args.duration)
    stop.set()
    await asyncio.wait_for(task, 60)
    gpus = {s.labels["gpu_class"]: s.value for m in rt.metrics["gpus_total"].collect() for s in m.samples}
    cached = {n: len(i.items) for n, i in view.informers.items()} if isinstance(view, ClusterCache) else {}
    await rt.aclose()
    args.result.write_text(json.dumps({
        "mode": args.mode, "baseline_rss_mib": baseline, "duration_s": args.duration,
        "requests": meter.requests, "bytes_per_s": sorted(meter.bytes_per_s.items()),
        "gpus_total_metric": gpus, "cached_objects": cached}))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("watch", "list"), required=True)
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--duration", type=float, required=True)
    ap.add_argument("--fill-interval", type=float, default=10.0)
    ap.add_argument("--autoscale-interval", type=float, default=15.0)
    ap.add_argument("--result", type=Path, required=True)
    asyncio.run(main(ap.parse_args()))

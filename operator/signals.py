"""Live traffic signals per pool: PromQL over Prometheus' HTTP API, or the pods' own /metrics.

Both sources return the same :class:`PoolMeasure` (requests in flight and queued, time to first
audio p99, and in-flight per pod so scale-down can pick the least busy pod). Metric names come from
the contract in :mod:`ttsfleet.metrics`; nothing here decides anything.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ttsfleet.contracts.serving import INFERENCE_PORT
from ttsfleet.metrics import histogram_quantile, spec

IN_FLIGHT = spec("inference_requests_in_flight").name
QUEUE = spec("inference_queue_depth").name
TTFA = spec("inference_ttfa_seconds").name


@dataclass(frozen=True)
class PodSample:
    """One scrape of one inference pod."""

    in_flight: float = 0.0
    queue_depth: float = 0.0
    ttfa_buckets: tuple[tuple[float, float], ...] = ()  # (le, cumulative count), le ascending


@dataclass(frozen=True)
class PoolMeasure:
    in_flight: float = 0.0
    queue_depth: float = 0.0
    ttfa_p99_s: float | None = None
    per_pod_in_flight: Mapping[str, float] = field(default_factory=dict)
    scraped: int = 0
    errors: int = 0


def parse_metrics(text: str) -> PodSample:
    """Sum the inference gauges and collect the ttfa histogram buckets from exposition text."""
    in_flight = queue = 0.0
    buckets: dict[float, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == IN_FLIGHT:
                in_flight += s.value
            elif s.name == QUEUE:
                queue += s.value
            elif s.name == TTFA + "_bucket":
                le = float(s.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + s.value
    return PodSample(in_flight, queue, tuple(sorted(buckets.items())))


def bucket_delta(now: Sequence[tuple[float, float]],
                 before: Sequence[tuple[float, float]] | None) -> tuple[tuple[float, float], ...]:
    """Per-bucket increase since the previous scrape (a counter reset restarts from zero)."""
    if not before:
        return tuple(now)
    prev = dict(before)
    delta = tuple((le, c - prev.get(le, 0.0)) for le, c in now)
    if any(c < 0 for _, c in delta):
        return tuple(now)
    return delta


def pod_url(pod: Mapping[str, Any], default_port: int | None = INFERENCE_PORT,
            port_name: str = "http") -> str | None:
    """``http://IP:PORT/metrics`` from the pod's IP and its container port named ``port_name``."""
    ip = (pod.get("status") or {}).get("podIP")
    port = default_port
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == port_name:
                port = int(p["containerPort"])
    if not ip or port is None:
        return None
    return f"http://{ip}:{port}/metrics"


def gauge_value(text: str, name: str) -> float | None:
    """The largest sample of gauge ``name`` in exposition text (None when absent)."""
    values = [s.value for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name]
    return max(values) if values else None


async def scrape_gauges(client: httpx.AsyncClient, urls: Mapping[str, str], name: str,
                        timeout_s: float = 2.0) -> dict[str, float]:
    """``key → value`` of one gauge from several endpoints at once; unreachable ones are left out."""
    async def one(url: str) -> float | None:
        try:
            resp = await client.get(url, timeout=timeout_s)
            resp.raise_for_status()
        except httpx.HTTPError:
            return None
        return gauge_value(resp.text, name)

    keys = list(urls)
    got = await asyncio.gather(*(one(urls[k]) for k in keys))
    return {k: v for k, v in zip(keys, got, strict=True) if v is not None}


class ScrapeSource:
    """Scrapes every running pod of one pool; remembers the last histogram per pod for deltas.

    One per pool: :meth:`measure` forgets the pods it was not given, so a source shared by two
    pools would drop the other pool's baselines on every call and report the p99 of each pod's
    whole history (a burst's slow first audio for ever) instead of the last interval's."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._last: dict[str, tuple[tuple[float, float], ...]] = {}

    async def _scrape(self, url: str) -> PodSample | None:
        try:
            resp = await self.client.get(url, timeout=5.0)
            resp.raise_for_status()
        except httpx.HTTPError:
            return None
        return parse_metrics(resp.text)

    async def measure(self, pods: Sequence[Mapping[str, Any]]) -> PoolMeasure:
        named = [(p["metadata"]["name"], pod_url(p)) for p in pods]
        named = [(n, u) for n, u in named if u]
        samples = await asyncio.gather(*(self._scrape(u) for _, u in named))
        per_pod: dict[str, float] = {}
        merged: dict[float, float] = {}
        queue = 0.0
        errors = 0
        for (name, _), s in zip(named, samples, strict=True):
            if s is None:
                errors += 1
                continue
            per_pod[name] = s.in_flight
            queue += s.queue_depth
            for le, c in bucket_delta(s.ttfa_buckets, self._last.get(name)):
                merged[le] = merged.get(le, 0.0) + c
            self._last[name] = s.ttfa_buckets
        live = {n for n, _ in named}
        self._last = {k: v for k, v in self._last.items() if k in live}
        p99 = histogram_quantile(0.99, sorted(merged.items()))
        return PoolMeasure(sum(per_pod.values()), queue, p99, per_pod, len(per_pod), errors)


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def pool_selector(namespace: str, deployment_name: str) -> str:
    """Series of one pool: the standard ``namespace``/``pod`` target labels of kubernetes-pods."""
    pods = re.escape(deployment_name) + "-[a-z0-9]+-[a-z0-9]+"
    return f'namespace="{_quote(namespace)}",pod=~"{_quote(pods)}"'


def promql(namespace: str, deployment_name: str, window_s: float) -> dict[str, str]:
    sel = pool_selector(namespace, deployment_name)
    w = f"{max(int(window_s), 30)}s"
    return {
        "in_flight": f"sum by (pod) ({IN_FLIGHT}{{{sel}}})",
        "queue": f"sum({QUEUE}{{{sel}}})",
        "p99": f"histogram_quantile(0.99, sum by (le) (rate({TTFA}_bucket{{{sel}}}[{w}])))",
    }


class PrometheusSource:
    """Reads the same signals with PromQL from ``TTSFLEET_PROMETHEUS_URL``."""

    def __init__(self, client: httpx.AsyncClient, url: str) -> None:
        self.client = client
        self.url = url.rstrip("/")

    async def _query(self, q: str) -> list[dict[str, Any]]:
        resp = await self.client.get(f"{self.url}/api/v1/query", params={"query": q}, timeout=10.0)
        resp.raise_for_status()
        body = resp.json()
        if body.get("status") != "success":
            raise httpx.HTTPError(f"prometheus: {body.get('error', 'query failed')}")
        return list(body["data"]["result"])

    async def measure(self, namespace: str, deployment_name: str, window_s: float) -> PoolMeasure:
        qs = promql(namespace, deployment_name, window_s)
        in_flight, queue, p99 = await asyncio.gather(*(self._query(qs[k]) for k in ("in_flight", "queue",
                                                                                      "p99")))
        per_pod = {r["metric"].get("pod", "?"): float(r["value"][1]) for r in in_flight}
        q = sum(float(r["value"][1]) for r in queue)
        p = None
        if p99:
            v = float(p99[0]["value"][1])
            p = None if math.isnan(v) else v
        return PoolMeasure(sum(per_pod.values()), q, p, per_pod, len(per_pod), 0)

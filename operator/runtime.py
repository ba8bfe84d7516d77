"""What the handlers share for the life of one operator process: clients, catalog, metrics, clocks.

One :class:`Runtime` is built by ``ttsfleet operator run`` (or by a test) and closed over by the
handlers in :mod:`ttsfleet.operator.handlers`; nothing lives in module globals, so several
operators (a test and its restart) can run in one process.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import httpx
from ttsfleet.operator.informer import ClusterCache, ClusterView
from ttsfleet.operator.kube import Kube

from ttsfleet.catalog import GpuCatalog
from ttsfleet.metrics import Collectors, make_collectors
from ttsfleet.policy.demand import DemandTracker, InferenceNeed

ENV_PROMETHEUS_URL = "TTSFLEET_PROMETHEUS_URL"


@dataclass
class Runtime:
    kube: Kube
    http: httpx.AsyncClient
    #: The run's catalog (``--catalog`` or the built-in one, chosen at the entry point only).
    catalog: GpuCatalog
    metrics: Collectors = field(default_factory=lambda: make_collectors(["operator", "core"]))
    prometheus_url: str | None = None
    autoscale_interval_s: float = 15.0
    fill_interval_s: float = 10.0
    retry_delay_s: float = 15.0  # a failed reconcile is retried after this long
    fill_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Inference demand per class over the forecast window (the policy's immutable tracker).
    demand: DemandTracker = field(default_factory=DemandTracker)
    #: What each TTSDeployment's load needs beyond its rate-limited step ("ns/name" -> the
    #: autoscaler's typed InferenceNeed): the fill controller evicts ahead of it.
    inference_need: dict[str, InferenceNeed] = field(default_factory=dict)
    inference_busy: dict[str, bool] = field(default_factory=dict)  # "ns/pod" -> request in flight
    #: Where the controllers observe pods and nodes: watch-fed caches (built on ``kube``).
    cluster: ClusterView | None = None

    def __post_init__(self) -> None:
        if self.cluster is None:
            self.cluster = ClusterCache(self.kube)

    @classmethod
    def from_environment(cls, **kw: object) -> Runtime:
        kw.setdefault("prometheus_url", os.environ.get(ENV_PROMETHEUS_URL) or None)
        return cls(kube=Kube.from_environment(), http=httpx.AsyncClient(timeout=10.0),
                   **kw)  # type: ignore[arg-type]

    def now(self) -> float:
        """The policy clock: monotonic seconds from the event loop (looptime-aware in tests)."""
        return asyncio.get_running_loop().time()

    @staticmethod
    def wall() -> float:
        return time.time()

    @property
    def view(self) -> ClusterView:
        assert self.cluster is not None  # set in __post_init__
        return self.cluster

    async def aclose(self) -> None:
        await self.view.aclose()
        await self.kube.aclose()
        await self.http.aclose()

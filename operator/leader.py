"""Leader election on a coordination.k8s.io/v1 Lease, so two operator replicas never both act.

Why a Lease and not kopf's peering: kopf peering pauses an instance only for a peer of *higher*
priority (replicas of one Deployment share a priority, so both would act, with a warning), needs
its own cluster-scoped CRD, and takes over after its 60 s peer lifetime. A Lease is built in, is
what kube-controller-manager, kube-scheduler and controller-runtime use, and needs only a Role in
the operator's own namespace.

The algorithm is client-go's: a candidate takes the Lease when it is free or when its record has
not changed for ``lease_duration_s`` *as the candidate observed it* (its own clock: no clock skew
between nodes matters); every write carries the ``resourceVersion`` it read, so of two candidates
only one wins. The leader renews every ``retry_period_s``; when no renewal succeeded for
``renew_deadline_s`` (< ``lease_duration_s``), or another holder shows up, it stops acting at once
(the kopf task is cancelled, the process exits non-zero and the pod restarts as a candidate). A
leader that stops normally (SIGTERM) releases the Lease, so the standby takes over within one retry
period instead of one lease duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from ttsfleet.operator.kube import Kube, KubeError, path

log = logging.getLogger(__name__)


class LeadershipLost(RuntimeError):
    """The Lease could not be renewed in time, or another candidate holds it now."""


@dataclass(frozen=True)
class LeaseConfig:
    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError("leader election needs 0 < retry period < renew deadline < lease duration "
                             f"(got {self.retry_period_s}, {self.renew_deadline_s}, {self.lease_duration_s})")

    @staticmethod
    def default_identity() -> str:
        """The pod's name (the chart sets POD_NAME), else host and process id."""
        return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def microtime(now: datetime.datetime | None = None) -> str:
    """A metav1.MicroTime: RFC 3339 with microseconds."""
    return (now or datetime.datetime.now(datetime.UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """One candidate for one Lease. ``clock`` is monotonic seconds (the event loop's by default)."""

    def __init__(self, kube: Kube, cfg: LeaseConfig, clock: Callable[[], float] | None = None) -> None:
        self.kube, self.cfg = kube, cfg
        self.clock = clock or (lambda: asyncio.get_running_loop().time())
        self.url = path("coordination.k8s.io/v1", "leases", cfg.namespace, cfg.name)
        self._observed: tuple[Any, ...] | None = None  # the last Lease record seen
        self._observed_at = 0.0
        self._resource_version: str | None = None
        self.holder: str = ""  # who holds the Lease, as last seen

    def _observe(self, spec: dict[str, Any], rv: str | None) -> None:
        record = (spec.get("holderIdentity") or "", spec.get("renewTime"), spec.get("acquireTime"),
                  spec.get("leaseTransitions"), spec.get("leaseDurationSeconds"))
        if record != self._observed:
            self._observed, self._observed_at = record, self.clock()
        self._resource_version, self.holder = rv, record[0]

    def _spec(self, old: dict[str, Any]) -> dict[str, Any]:
        now = microtime()
        mine = (old.get("holderIdentity") or "") == self.cfg.identity
        return {"holderIdentity": self.cfg.identity,
                "leaseDurationSeconds": max(1, round(self.cfg.lease_duration_s)),
                "acquireTime": old.get("acquireTime") if mine and old.get("acquireTime") else now,
                "renewTime": now,
                "leaseTransitions": int(old.get("leaseTransitions") or 0) + (0 if mine or not old else 1)}

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this candidate holds the Lease afterwards."""
        lease = await self.kube.get(self.url)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.cfg.name, "namespace": self.cfg.namespace},
                    "spec": self._spec({})}
            try:
                made = await self.kube.create(self.url.rsplit("/", 1)[0], body)
            except KubeError as exc:
                if exc.status == 409:  # another candidate created it first
                    return False
                raise
            self._observe(made["spec"], made["metadata"].get("resourceVersion"))
            return True
        spec = lease.get("spec") or {}
        self._observe(spec, lease["metadata"].get("resourceVersion"))
        holder = spec.get("holderIdentity") or ""
        expired = self.clock() - self._observed_at > self.cfg.lease_duration_s
        if holder and holder != self.cfg.identity and not expired:
            return False
        patch = {"metadata": {"resourceVersion": self._resource_version}, "spec": self._spec(spec)}
        try:
            got = await self.kube.patch(self.url, patch)
        except KubeError as exc:
            if exc.status == 409:  # the Lease changed since we read it: somebody else wrote it
                return False
            raise
        self._observe(got["spec"], got["metadata"].get("resourceVersion"))
        return True

    async def _attempt(self, timeout: float) -> bool:
        try:
            return await asyncio.wait_for(self.try_acquire_or_renew(), timeout=max(0.1, timeout))
        except (TimeoutError, httpx.HTTPError, KubeError) as exc:
            log.warning("lease %s/%s: %r", self.cfg.namespace, self.cfg.name, exc)
            return False

    async def acquire(self) -> None:
        """Wait until this candidate holds the Lease."""
        logged = False
        while not await self._attempt(self.cfg.retry_period_s * 2):
            if not logged and self.holder:
                log.info("standby: lease %s/%s is held by %s", self.cfg.namespace, self.cfg.name, self.holder)
                logged = True
            await asyncio.sleep(self.cfg.retry_period_s)
        log.info("leading: lease %s/%s acquired by %s", self.cfg.namespace, self.cfg.name, self.cfg.identity)

    async def hold(self) -> None:
        """Renew until that fails; returns (never raises) when leadership is lost."""
        last_ok = self.clock()
        while True:
            await asyncio.sleep(self.cfg.retry_period_s)
            left = self.cfg.renew_deadline_s - (self.clock() - last_ok)
            if await self._attempt(left):
                last_ok = self.clock()
                continue
            if self.holder and self.holder != self.cfg.identity:
                log.error("lease %s/%s taken by %s", self.cfg.namespace, self.cfg.name, self.holder)
                return
            if self.clock() - last_ok >= self.cfg.renew_deadline_s:
                log.error("lease %s/%s not renewed for %.0f s", self.cfg.namespace, self.cfg.name,
                          self.cfg.renew_deadline_s)
                return

    async def release(self) -> None:
        """Give the Lease up (only if still ours), so a standby need not wait for it to expire."""
        with contextlib.suppress(httpx.HTTPError, KubeError, TimeoutError):
            lease = await asyncio.wait_for(self.kube.get(self.url), timeout=self.cfg.retry_period_s)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.cfg.identity:
                return
            await asyncio.wait_for(self.kube.patch(self.url, {
                "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                "spec": {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": microtime()}}),
                timeout=self.cfg.retry_period_s)
            log.info("lease %s/%s released", self.cfg.namespace, self.cfg.name)


async def run_elected(elector: LeaderElector, lead: Callable[[], Awaitable[None]],
                      standby: Callable[[], Awaitable[None]] | None = None) -> None:
    """Wait for the Lease (running ``standby`` meanwhile, e.g. a health endpoint), then run
    ``lead`` while renewing. Leadership lost: ``lead`` is cancelled and :class:`LeadershipLost`
    raised. ``lead`` finished (a normal stop): the Lease is released and its outcome returned."""
    waiting = asyncio.create_task(standby()) if standby is not None else None
    try:
        await elector.acquire()
    finally:
        if waiting is not None:
            waiting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiting
    work = asyncio.create_task(lead())
    keeper = asyncio.create_task(elector.hold())
    try:
        await asyncio.wait({work, keeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        lost = keeper.done() and not work.done()
        for task in (work, keeper):
            task.cancel()
        await asyncio.gather(work, keeper, return_exceptions=True)
        if not lost:
            await elector.release()
    if lost:
        cfg = elector.cfg
        raise LeadershipLost(f"lease {cfg.namespace}/{cfg.name} lost by {cfg.identity}")
    work.result()

"""Two operator processes with leader election (``--leader-elect``) on a real control plane.

Each is a real ``ttsfleet operator run`` process with its own token of the chart's ServiceAccount,
so the API server's audit log tells them apart (``authentication.kubernetes.io/credential-id``
carries the token's JTI). Only the Lease holder writes; the standby only reads the Lease. The
holder killed with SIGKILL: the standby takes over within the lease duration plus one retry
period, and carries on with the same children (no duplicates). The holder stopped with SIGTERM
releases the Lease, so the standby takes over without waiting for it to expire.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ttsfleet.devtools.localkube import LocalKube
from ttsfleet.devtools.ports import free_port

from . import audit
from .conftest import RELEASES, Api, gone, wait_for

NS = "tts-peer"
LEASE_NS = RELEASES["ttsfleet"]["namespace"]
LEASE_NAME = "ttsfleet-operator"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{LEASE_NS}/leases/{LEASE_NAME}"
TTSD = f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments"
USER = audit.sa_user("ttsfleet", "ttsfleet")
# A 6 s lease (renewed every 1 s, given up after 4 s without a renewal): the SIGKILL takeover waits
# for it to expire, so it is what that half of the test lasts; the SIGTERM handover took 0.6 s.
DURATION, DEADLINE, RETRY = 6, 4, 1
CREDENTIAL = "authentication.kubernetes.io/credential-id"  # the token's JTI, per audit event


def ttsfleet_command() -> list[str]:
    script = Path(sys.executable).with_name("ttsfleet")
    if script.exists():
        return [str(script)]
    found = shutil.which("ttsfleet")
    if found is None:
        pytest.skip("the ttsfleet console script is not installed")
    return [found]


def jti(token: str) -> str:
    payload = token.split(".")[1]
    return str(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"])


class OperatorProcess:
    """``ttsfleet operator run --leader-elect`` as its own process, with its own token."""

    def __init__(self, kube: LocalKube, identity: str, tmp: Path) -> None:
        token = kube.service_account_token("ttsfleet", "ttsfleet")
        self.identity, self.jti = identity, jti(token)
        self.kubeconfig = kube.write_kubeconfig(tmp / f"{identity}.kubeconfig", token, USER)
        self.log = tmp / f"{identity}.log"
        self.health_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        env = {k: v for k, v in os.environ.items()
               if k not in ("KUBERNETES_SERVICE_HOST", "TTSFLEET_PROMETHEUS_URL")}
        env.update(KUBECONFIG=str(self.kubeconfig), POD_NAME=self.identity, POD_NAMESPACE=LEASE_NS)
        argv = [*ttsfleet_command(), "operator", "run", "--metrics-port", str(free_port()),
                "--health-port", str(self.health_port), "--autoscale-interval", "2", "--fill-interval", "2",
                "--leader-elect", "--lease-name", LEASE_NAME, "--lease-duration", str(DURATION),
                "--renew-deadline", str(DEADLINE), "--retry-period", str(RETRY)]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        return self

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def exited(self) -> bool:
        assert self.proc is not None
        return self.proc.poll() is not None

    async def health(self) -> dict[str, Any] | None:
        try:
            async with httpx.AsyncClient(timeout=2) as client:
                r = await client.get(f"http://127.0.0.1:{self.health_port}/healthz")
            return r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def by(events: list[dict[str, Any]], proc: OperatorProcess) -> list[dict[str, Any]]:
    cred = f"JTI={proc.jti}"
    return [e for e in events
            if cred in (e.get("user", {}).get("extra", {}).get(CREDENTIAL) or [])]


@pytest.fixture
def processes(kube: LocalKube, tmp_path: Path) -> Iterator[list[OperatorProcess]]:
    made: list[OperatorProcess] = []
    yield made
    for p in made:
        p.stop()


async def holder(api: Api) -> str:
    lease = await api.get(LEASE) or {}
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


async def held_by(api: Api, identity: str) -> bool:
    return await holder(api) == identity


async def test_one_leader_acts_and_the_standby_takes_over(
        releases: Any, api: Api, kube: LocalKube, tmp_path: Path, processes: list[OperatorProcess]) -> None:
    await api.namespace(NS)
    a = OperatorProcess(kube, "op-a", tmp_path).start()
    processes.append(a)
    await wait_for(lambda: held_by(api, "op-a"), 60, f"op-a holding the Lease\n{a.tail()}")
    b = OperatorProcess(kube, "op-b", tmp_path).start()
    processes.append(b)
    assert await wait_for(b.health, 60, "op-b's standby /healthz") == {"standby": True}

    since = audit.mark(kube)
    await api.create(TTSD, {
        "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "peer"},
        "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                 "pools": [{"gpuClass": "h200", "minReplicas": 1, "maxReplicas": 2}],
                 "resources": {"cpu": "0.5", "memory": "1Gi"}}})
    await wait_for(lambda: _running(api, 1), 60, "1 inference pod Running")
    await asyncio.sleep(4 * RETRY)
    events = audit.requests(kube, USER, since)
    assert audit.writes(by(events, a)), "the leader wrote nothing"
    standby = {audit.call(e)[:3] for e in by(events, b)}
    assert standby <= {("coordination.k8s.io", "leases", "get")}, f"the standby did more: {standby}"
    assert await holder(api) == "op-a"

    # SIGKILL: no release; the standby waits for the Lease to go unrenewed for its duration.
    a.signal(signal.SIGKILL)
    killed = asyncio.get_running_loop().time()
    await wait_for(lambda: held_by(api, "op-b"), DURATION + 20, f"op-b taking over\n{b.tail()}")
    took = asyncio.get_running_loop().time() - killed
    assert took <= DURATION + 2 * RETRY + 3, f"took {took:.1f} s"
    since = audit.mark(kube)
    body = await api.get(f"{TTSD}/peer")
    await api.patch(f"{TTSD}/peer", {"spec": {"pools": [{**body["spec"]["pools"][0], "minReplicas": 2}]}})
    await wait_for(lambda: _running(api, 2), 60, f"the new leader scaling to 2\n{b.tail()}")
    events = audit.requests(kube, USER, since)
    assert audit.writes(by(events, b)) and not by(events, a)
    for plural, group, count in (("deployments", "apps/v1", 1), ("services", "v1", 2),
                                 ("poddisruptionbudgets", "policy/v1", 1)):
        base = f"/apis/{group}" if "/" in group else f"/api/{group}"
        items = await api.items(f"{base}/namespaces/{NS}/{plural}",
                                labelSelector="app.kubernetes.io/instance=peer")
        assert len(items) == count, f"{plural}: {[i['metadata']['name'] for i in items]}"
    lease = await api.get(LEASE)
    assert lease["spec"]["leaseTransitions"] == 1

    # SIGTERM: the leader stops cleanly and releases the Lease; no waiting for it to expire.
    a2 = OperatorProcess(kube, "op-a2", tmp_path).start()
    processes.append(a2)
    await wait_for(a2.health, 60, "op-a2's standby /healthz")
    await asyncio.sleep(2 * RETRY)  # op-a2 has seen the Lease held
    b.signal(signal.SIGTERM)
    stopped = asyncio.get_running_loop().time()
    await wait_for(b.exited, 30, "op-b exiting")
    assert b.proc is not None and b.proc.returncode == 0, b.tail()
    await wait_for(lambda: held_by(api, "op-a2"), DURATION, f"op-a2 taking the released Lease\n{a2.tail()}")
    # an unreleased Lease goes no sooner than DURATION - RETRY after the stop (its last renewal)
    assert asyncio.get_running_loop().time() - stopped < DURATION - 2 * RETRY, "the Lease was not released"

    assert await api.delete(f"{TTSD}/peer") == 200
    await wait_for(lambda: gone(api, f"{TTSD}/peer"), 60, f"the TTSDeployment gone\n{a2.tail()}")
    a2.signal(signal.SIGTERM)
    await wait_for(a2.exited, 30, "op-a2 exiting")
    assert await holder(api) == "", "a clean stop leaves the Lease free"


async def _running(api: Api, n: int) -> bool:
    items = await api.items(f"/api/v1/namespaces/{NS}/pods", labelSelector="app.kubernetes.io/instance=peer")
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    return len(live) == n and all((p.get("status") or {}).get("phase") == "Running" for p in live)

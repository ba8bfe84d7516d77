"""The process kubelet on a real control plane: pods whose containers really run.

One node run by :mod:`ttsfleet.devtools.kubelet`. Two pods of one Deployment-like shape run the same
Python HTTP server on ``0.0.0.0:8000`` — each on its own loopback address, found through the pod
IP — with env from a ConfigMap and a ConfigMap file mounted at an absolute path, Ready only once
their readinessProbe passes; a pod that checkpoints on SIGTERM exits 99 into its status; a
restartPolicy Always container that crashes is restarted.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from ttsfleet.devtools.localkube import FakeNode, LocalKube
from ttsfleet.devtools.wait import wait_for_async

from tests.kube import started

NS = "default"
SERVER = r"""
import http.server, os, pathlib, signal, sys, time
ready_at = time.time() + float(os.environ["READY_AFTER_S"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/readyz" and time.time() < ready_at:
            self.send_response(503); self.end_headers(); return
        body = (os.environ["GREETING"] + "|" + pathlib.Path(sys.argv[1]).read_text()).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a):
        pass
srv = http.server.HTTPServer(("0.0.0.0", 8000), H)
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
srv.serve_forever()
"""
CHECKPOINTER = r"""
import os, pathlib, signal, sys, time
out = pathlib.Path(sys.argv[1])
def stop(*a):
    out.write_text("checkpointed")
    pathlib.Path(os.environ["STATE"]).write_text("items_done=3")
    sys.exit(99)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(0.1)
"""


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalKube]:
    with started(tmp_path_factory.mktemp("kube"), [FakeNode("proc-a", {"role": "proc"}, gpus=2,
                                                            processes=True)]) as k:
        yield k


@pytest.fixture
async def api(kube: LocalKube) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=kube.url, timeout=30,
                                 verify=ssl.create_default_context(cafile=str(kube.ca_file)),
                                 headers={"Authorization": f"Bearer {kube.admin_token}"}) as client:
        yield client


def python(name: str, code: str, args: list[str], **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "local", "command": ["python", "-c", code], "args": args,
                 **spec.pop("container", {})}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [container], "terminationGracePeriodSeconds": 5, **spec}}


async def pod(api: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    r = await api.get(f"/api/v1/namespaces/{NS}/pods/{name}")
    return None if r.status_code == 404 else r.json()


def ready(p: dict[str, Any] | None) -> bool:
    conds = ((p or {}).get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)


async def test_pods_run_their_commands_on_their_own_addresses(api: httpx.AsyncClient,
                                                              kube: LocalKube) -> None:
    r = await api.post(f"/api/v1/namespaces/{NS}/configmaps", json={
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "site"},
        "data": {"greeting": "hello", "catalog.yaml": "classes: {}\n"}})
    assert r.status_code == 201, r.text
    greeting = {"configMapKeyRef": {"name": "site", "key": "greeting"}}
    server = {"env": [{"name": "GREETING", "valueFrom": greeting},
                      {"name": "READY_AFTER_S", "value": "1.5"}],
              "ports": [{"name": "http", "containerPort": 8000}],
              "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 1},
              "volumeMounts": [{"name": "site", "mountPath": "/etc/site", "readOnly": True}]}
    for name in ("web-a", "web-b"):
        body = python(name, SERVER, ["/etc/site/catalog.yaml"], container=dict(server),
                      volumes=[{"name": "site", "configMap": {"name": "site"}}])
        r = await api.post(f"/api/v1/namespaces/{NS}/pods", json=body)
        assert r.status_code == 201, r.text

    async def running(name: str) -> dict[str, Any] | None:
        p = await pod(api, name)
        return p if ((p or {}).get("status") or {}).get("phase") == "Running" else None
    a = await wait_for_async(lambda: running("web-a"), 60, "web-a Running")
    assert not ready(a), "Ready before the readinessProbe passed"
    a = await wait_for_async(lambda: _ready(api, "web-a"), 30, "web-a Ready")
    b = await wait_for_async(lambda: _ready(api, "web-b"), 30, "web-b Ready")
    ips = {a["status"]["podIP"], b["status"]["podIP"]}
    assert len(ips) == 2 and all(ip.startswith(kube.pod_ip_prefix + ".") for ip in ips)
    async with httpx.AsyncClient(timeout=5) as client:
        for ip in ips:  # both bound 0.0.0.0:8000, each got its own address
            assert (await client.get(f"http://{ip}:8000/")).text == "hello|classes: {}\n"

    # Deletion: SIGTERM, the exit code back into the status, the pod gone after it.
    r = await api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/web-a")
    assert r.status_code == 200
    await wait_for_async(lambda: _gone(api, "web-a"), 30, "web-a deleted after its process exited")
    log = (kube.kubelet_root / "pods" / NS).glob("web-a-*/main.log")
    assert any("start:" in p.read_text() for p in log)
    assert (await api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/web-b")).status_code == 200
    await wait_for_async(lambda: _gone(api, "web-b"), 30, "web-b deleted")


async def test_sigterm_exit_code_and_restarts(api: httpx.AsyncClient, kube: LocalKube,
                                              tmp_path: Path) -> None:
    marker = tmp_path / "ckpt"
    body = python("ckpt", CHECKPOINTER, ["/work/ckpt"], restartPolicy="Never",
                  container={"volumeMounts": [{"name": "work", "mountPath": "/work"}],
                             "env": [{"name": "STATE", "value": "/dev/termination-log"}],
                             "terminationMessagePath": "/dev/termination-log"},
                  volumes=[{"name": "work", "hostPath": {"path": str(tmp_path)}}])
    assert (await api.post(f"/api/v1/namespaces/{NS}/pods", json=body)).status_code == 201
    crash = python("crash", "import sys; sys.exit(3)", [], restartPolicy="Always")
    assert (await api.post(f"/api/v1/namespaces/{NS}/pods", json=crash)).status_code == 201
    await wait_for_async(lambda: _ready(api, "ckpt"), 60, "ckpt Ready (no readinessProbe: when started)")

    # Evicted with a grace period (what the fill controller does): the process checkpoints and
    # exits 99, and the pod's terminal status says so (with its termination message, which the
    # process wrote to the path the pod names) before the deletion completes.
    watch = asyncio.create_task(exit_codes_until_deleted(api, "ckpt"))
    await asyncio.sleep(0.5)
    r = await api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/ckpt",
                          json={"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 3})
    assert r.status_code == 200
    seen = await asyncio.wait_for(watch, 30)
    assert marker.read_text() == "checkpointed"
    assert (99, "items_done=3") in seen, f"exit codes and messages seen in the status: {seen}"
    assert not Path("/dev/termination-log").exists(), "the message went to the host's /dev"

    async def restarted() -> bool:
        p = await pod(api, "crash") or {}
        cs = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
        return cs.get("restartCount", 0) >= 2 and cs["lastState"]["terminated"]["exitCode"] == 3
    await wait_for_async(restarted, 30, "the crashing container restarted twice")
    assert (await api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/crash")).status_code == 200
    await wait_for_async(lambda: _gone(api, "crash"), 30, "crash deleted")


async def exit_codes_until_deleted(api: httpx.AsyncClient, name: str) -> list[tuple[int, str]]:
    """Every (exit code, message) a watch on the pod shows, until the pod is deleted."""
    seen: list[tuple[int, str]] = []
    params = {"watch": "1", "fieldSelector": f"metadata.name={name}"}
    async with api.stream("GET", f"/api/v1/namespaces/{NS}/pods", params=params, timeout=None) as resp:
        async for line in resp.aiter_lines():
            if not line:
                continue
            event = json.loads(line)
            for c in (event["object"].get("status") or {}).get("containerStatuses") or []:
                if "terminated" in (c.get("state") or {}):
                    term = c["state"]["terminated"]
                    seen.append((term["exitCode"], term.get("message", "")))
            if event["type"] == "DELETED":
                return seen
    return seen


async def _ready(api: httpx.AsyncClient, name: str) -> dict[str, Any] | None:
    p = await pod(api, name)
    return p if ready(p) else None


async def _gone(api: httpx.AsyncClient, name: str) -> bool:
    return await pod(api, name) is None

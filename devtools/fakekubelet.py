"""A fake kubelet for the local control plane: GPU nodes as API objects, their pods "run".

What it plays, and only that: it registers the nodes (``nvidia.com/gpu`` capacity, class labels,
Ready), turns every pod bound to one of them into Running + Ready with a loopback pod IP, and
completes graceful deletion the way a kubelet does (the container "exits", then the pod is
deleted with grace 0 and a uid precondition). Containers run nothing, so a test drives exits
through annotations (``fake-kubelet.ttsfleet.io/...``):

* ``exit-code: N`` — the container exits with N now (Succeeded for 0, else Failed);
* ``sigterm-exit: N`` — exit code on SIGTERM (default: the fill image's checkpoint-and-requeue
  code 99 for fill pods, 0 for everything else);
* ``sigterm-delay-s: S`` — seconds from SIGTERM to exit (default 0; capped by the grace period).

A node labelled ``fake-kubelet.ttsfleet.io/stopped=true`` is a dead kubelet: its pods are left
as they are (Terminating pods stay Terminating), as on a NotReady node.

Run by :class:`ttsfleet.devtools.localkube.LocalKube` as ``python -m ttsfleet.devtools.fakekubelet
--kubeconfig K --nodes nodes.json``.
"""

from __future__ import annotations

import argparse
import datetime
import heapq
import json
import logging
import queue
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from ttsfleet.contracts.exits import PREEMPTED_REQUEUE

log = logging.getLogger("fake-kubelet")
A = "fake-kubelet.ttsfleet.io/"
STOPPED_LABEL = A + "stopped"


def now_iso() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def client_from_kubeconfig(path: Path) -> httpx.Client:
    cfg = json.loads(path.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    token = cfg["users"][0]["user"]["token"]
    return httpx.Client(base_url=cluster["server"], timeout=30,
                        verify=ssl.create_default_context(cafile=cluster["certificate-authority"]),
                        headers={"Authorization": f"Bearer {token}"})


def node_object(spec: dict[str, Any]) -> dict[str, Any]:
    cap = {"cpu": spec["cpu"], "memory": spec["memory"], "pods": "110",
           "nvidia.com/gpu": str(spec["gpus"])}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": spec["name"], "labels": {"kubernetes.io/hostname": spec["name"],
                                                          **spec["labels"]}},
            "spec": {"taints": list(spec["taints"])},
            "status": {"capacity": cap, "allocatable": cap}}


def node_status() -> dict[str, Any]:
    t = now_iso()
    return {"status": {"conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "fake kubelet",
         "lastHeartbeatTime": t, "lastTransitionTime": t}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}}


def container_states(pod: dict[str, Any], state: dict[str, Any], ready: bool) -> list[dict[str, Any]]:
    return [{"name": c["name"], "image": c.get("image", ""), "imageID": "", "ready": ready,
             "restartCount": 0, "started": ready, "state": state}
            for c in pod["spec"].get("containers") or []]


def running_status(pod: dict[str, Any], ip: str) -> dict[str, Any]:
    t = now_iso()
    conds = [{"type": k, "status": "True", "lastTransitionTime": t}
             for k in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]
    return {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                       "startTime": t, "conditions": conds,
                       "containerStatuses": container_states(pod, {"running": {"startedAt": t}}, True)}}


def exited_status(pod: dict[str, Any], code: int) -> dict[str, Any]:
    t = now_iso()
    term = {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                           "startedAt": (pod.get("status") or {}).get("startTime") or t, "finishedAt": t}}
    conds = [{"type": k, "status": "False", "lastTransitionTime": t} for k in ("ContainersReady", "Ready")]
    return {"status": {"phase": "Succeeded" if code == 0 else "Failed", "conditions": conds,
                       "containerStatuses": container_states(pod, term, False)}}


class FakeKubelet:
    def __init__(self, client: httpx.Client, nodes: list[dict[str, Any]], ip_prefix: str = "127.77") -> None:
        self.client = client
        self.ip_prefix = ip_prefix  # pod IPs are ip_prefix.X.Y (one prefix per control plane)
        self.nodes = {n["name"]: n for n in nodes}
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.timers: list[tuple[float, str, str, str]] = []  # (due, ns, name, uid)
        self.ips: dict[str, str] = {}
        self.stopped: set[str] = set()
        self.terminating: set[str] = set()

    # --- API ------------------------------------------------------------------------------
    def patch_status(self, pod: dict[str, Any], body: dict[str, Any]) -> None:
        m = pod["metadata"]
        r = self.client.patch(f"/api/v1/namespaces/{m['namespace']}/pods/{m['name']}/status",
                              content=json.dumps(body),
                              headers={"Content-Type": "application/merge-patch+json"})
        if r.status_code not in (200, 404, 409):
            log.warning("status of %s/%s: HTTP %s %s", m["namespace"], m["name"], r.status_code, r.text[:200])

    def final_delete(self, ns: str, name: str, uid: str) -> None:
        r = self.client.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}", content=json.dumps(
            {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
             "preconditions": {"uid": uid}}), headers={"Content-Type": "application/json"})
        if r.status_code not in (200, 404, 409):
            log.warning("delete %s/%s: HTTP %s %s", ns, name, r.status_code, r.text[:200])

    def register_nodes(self) -> None:
        for spec in self.nodes.values():
            r = self.client.post("/api/v1/nodes", json=node_object(spec))
            if r.status_code not in (201, 409):
                raise RuntimeError(f"node {spec['name']}: HTTP {r.status_code} {r.text[:300]}")
            merge = {"Content-Type": "application/merge-patch+json"}
            self.client.patch(f"/api/v1/nodes/{spec['name']}/status", content=json.dumps(node_status()),
                              headers=merge).raise_for_status()
            # The API server taints a new node not-ready; the node lifecycle controller (off here:
            # nothing heartbeats) would lift it once Ready. This kubelet is Ready at once.
            taints = {"spec": {"taints": list(spec["taints"])}}
            self.client.patch(f"/api/v1/nodes/{spec['name']}", headers=merge,
                              content=json.dumps(taints)).raise_for_status()

    # --- the pod state machine ------------------------------------------------------------
    def ip_for(self, uid: str) -> str:
        if uid not in self.ips:
            n = len(self.ips)
            self.ips[uid] = f"{self.ip_prefix}.{n // 250}.{n % 250 + 1}"
        return self.ips[uid]

    def handle(self, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = spec.get("nodeName")
        if node not in self.nodes or node in self.stopped:
            return
        ann = meta.get("annotations") or {}
        phase = (pod.get("status") or {}).get("phase")
        key = (meta["namespace"], meta["name"], meta["uid"])
        if meta.get("deletionTimestamp"):
            if phase in ("Succeeded", "Failed"):
                self.final_delete(*key)
            elif meta["uid"] not in self.terminating:
                self.terminating.add(meta["uid"])
                grace = float(meta.get("deletionGracePeriodSeconds") or 0)
                delay = min(float(ann.get(A + "sigterm-delay-s", 0)), grace)
                heapq.heappush(self.timers, (time.monotonic() + delay, *key))
            return
        if phase in ("Succeeded", "Failed"):
            return
        if A + "exit-code" in ann:
            self.patch_status(pod, exited_status(pod, int(ann[A + "exit-code"])))
        elif phase != "Running":
            self.patch_status(pod, running_status(pod, self.ip_for(meta["uid"])))

    def sigterm_exit(self, ns: str, name: str) -> None:
        r = self.client.get(f"/api/v1/namespaces/{ns}/pods/{name}")
        if r.status_code != 200:
            return
        pod = r.json()
        labels = pod["metadata"].get("labels") or {}
        default = PREEMPTED_REQUEUE if labels.get("ttsfleet.io/workload") == "fill" else 0
        code = int((pod["metadata"].get("annotations") or {}).get(A + "sigterm-exit", default))
        self.patch_status(pod, exited_status(pod, code))
        self.final_delete(ns, name, pod["metadata"]["uid"])

    # --- list + watch ---------------------------------------------------------------------
    def watch(self, resource: str) -> None:
        """Feed ``self.events`` from a list then a watch, forever (re-listing when a watch ends)."""
        while True:
            try:
                r = self.client.get(resource)
                r.raise_for_status()
                body = r.json()
                for item in body.get("items") or []:
                    self.events.put(item | {"kind": "Node" if "nodes" in resource else "Pod"})
                rv = body["metadata"]["resourceVersion"]
                # Short watches: every re-list re-delivers every object, so a step that failed
                # (an API hiccup under load) is retried within seconds, as a kubelet's resync does.
                params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "10",
                          "allowWatchBookmarks": "false"}
                with self.client.stream("GET", resource, params=params, timeout=None) as resp:
                    for line in resp.iter_lines():
                        if line:
                            ev = json.loads(line)
                            if ev.get("type") in ("ADDED", "MODIFIED"):
                                self.events.put(ev["object"])
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("watch %s: %r", resource, exc)
                time.sleep(0.5)

    def on_node(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        if name not in self.nodes:
            return
        was = name in self.stopped
        if (node["metadata"].get("labels") or {}).get(STOPPED_LABEL) == "true":
            self.stopped.add(name)
        else:
            self.stopped.discard(name)
            if was:  # a kubelet back from the dead resyncs its pods
                r = self.client.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={name}"})
                for pod in r.json().get("items") or []:
                    self.events.put(pod | {"kind": "Pod"})

    def run(self) -> None:
        self.register_nodes()
        for res in ("/api/v1/nodes", "/api/v1/pods"):
            threading.Thread(target=self.watch, args=(res,), daemon=True).start()
        while True:
            timeout = 0.5
            if self.timers:
                timeout = max(min(self.timers[0][0] - time.monotonic(), 0.5), 0.0)
            try:
                obj = self.events.get(timeout=timeout)
                (self.on_node if obj.get("kind") == "Node" else self.handle)(obj)
            except queue.Empty:
                pass
            except httpx.HTTPError as exc:
                log.warning("handling an event: %r", exc)
            while self.timers and self.timers[0][0] <= time.monotonic():
                _, ns, name, uid = heapq.heappop(self.timers)
                try:
                    self.sigterm_exit(ns, name)
                    self.terminating.discard(uid)
                except httpx.HTTPError as exc:  # try again shortly
                    log.warning("terminating %s/%s: %r", ns, name, exc)
                    heapq.heappush(self.timers, (time.monotonic() + 1.0, ns, name, uid))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--nodes", type=Path, required=True, help="JSON list of FakeNode fields")
    ap.add_argument("--pod-ip-prefix", default="127.77", help="pod IPs are PREFIX.X.Y (loopback)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    FakeKubelet(client_from_kubeconfig(args.kubeconfig), json.loads(args.nodes.read_text()),
                args.pod_ip_prefix).run()


if __name__ == "__main__":
    main()

"""A kubelet stand-in whose pods really run: each container's command is a local process.

:mod:`ttsfleet.devtools.fakekubelet` only plays pod states; this one runs what the pod says, for
the demo and the end-to-end loop test (real ``ttsfleet serve`` replicas, real ``ttsfleet fill
run`` shards and the chart's operator, all scheduled by the real kube-scheduler). Per pod bound
to one of its nodes it

* gives the pod a loopback address of its own (``127.X.Y.Z``) and makes a wildcard bind in its
  Python processes bind it (:mod:`ttsfleet.devtools.podnet`), as a pod network namespace would;
* prepares its volumes (:mod:`ttsfleet.devtools.podvolumes`: emptyDir, ConfigMap, Secret,
  projected ServiceAccount token, PVC → the PV's host path) and starts each container's
  ``command``/``args`` with the pod's env (:mod:`ttsfleet.devtools.podspec`: mount paths become
  host paths, ``$(VAR)`` expanded), stdout/stderr to ``<root>/pods/<ns>/<pod>/<container>.log``;
* runs the startup, liveness and readiness probes (:mod:`ttsfleet.devtools.probes`) and writes
  ``started``/``ready`` and the Ready condition from them (:mod:`ttsfleet.devtools.podstatus`),
  so a Service's EndpointSlices follow the server's own ``/readyz``;
* restarts containers per ``restartPolicy`` (back-off 1 s doubling to 10 s; the real kubelet's
  starts at 10 s), liveness and startup failures included;
* on deletion runs ``preStop``, sends SIGTERM to the container's process, SIGKILLs the process
  group when the grace period (``deletionGracePeriodSeconds``) is over, reports the exit code
  (a signal N as 128 + N) and finishes the deletion (grace 0, uid precondition).

Not played: images (the command runs from the current environment: ``PATH`` starts with this
Python's ``bin``), resource limits, init and ephemeral containers, ``readOnly`` mounts, volume
refresh. Run by :class:`ttsfleet.devtools.localkube.LocalKube` for nodes with
``FakeNode(processes=True)`` as ``python -m ttsfleet.devtools.kubelet``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import httpx
from ttsfleet.devtools import podnet, podspec, podvolumes
from ttsfleet.devtools.fakekubelet import node_object, node_status
from ttsfleet.devtools.podstatus import ContainerRecord, PodView, exit_code, now_iso, pod_status
from ttsfleet.devtools.probes import ProbeState, ProbeTiming, Target, probe_once, run_hook

log = logging.getLogger("kubelet")
TICK_S = 0.1
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 10.0)
#: What a force delete (grace 0) still gives a process, as the kubelet's minimum.
MIN_GRACE_S = 2.0
FIRST_BLOCK = 128


class KubeApi:
    """The few calls a kubelet makes, as JSON over the admin's token."""

    def __init__(self, server: str, ca_file: str, token: str) -> None:
        self._server, self._ca = server, ca_file
        self.client = httpx.AsyncClient(base_url=server, timeout=30,
                                        verify=ssl.create_default_context(cafile=ca_file),
                                        headers={"Authorization": f"Bearer {token}"})

    @property
    def server(self) -> str:
        return self._server

    @property
    def ca_file(self) -> str:
        return self._ca

    @classmethod
    def from_kubeconfig(cls, path: Path) -> KubeApi:
        cfg = json.loads(path.read_text())
        cluster = cfg["clusters"][0]["cluster"]
        return cls(cluster["server"], cluster["certificate-authority"], cfg["users"][0]["user"]["token"])

    async def get_json(self, path: str) -> dict[str, Any] | None:
        r = await self.client.get(path)
        if r.status_code == 404:
            return None
        r.raise_for_status()
        return dict(r.json())

    async def post_json(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.client.post(path, json=body)
        if r.status_code >= 300:
            raise podspec.ContainerConfigError(f"POST {path}: HTTP {r.status_code} {r.text[:200]}")
        return dict(r.json())

    async def merge_patch(self, path: str, body: dict[str, Any]) -> int:
        r = await self.client.patch(path, content=json.dumps(body),
                                    headers={"Content-Type": "application/merge-patch+json"})
        return r.status_code

    async def event(self, pod: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(httpx.HTTPError):
            await self.client.post(f"/api/v1/namespaces/{meta['namespace']}/events", json={
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}."},
                "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": meta["namespace"],
                                   "name": meta["name"], "uid": meta["uid"]},
                "type": kind, "reason": reason, "message": message[:1000],
                "source": {"component": "kubelet", "host": (pod.get("spec") or {}).get("nodeName", "")},
                "firstTimestamp": now_iso(), "lastTimestamp": now_iso(), "count": 1})

    async def aclose(self) -> None:
        await self.client.aclose()


def _die_with_parent() -> None:
    """In a container's process before exec: SIGKILL when the kubelet dies, so nothing outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Container:
    """One container of a pod: its resolved process, the record the status is built from, probes."""

    def __init__(self, spec: Mapping[str, Any], target: Target, argv: list[str], log_path: Path,
                 message_path: Path | None = None) -> None:
        self.spec, self.target, self.argv, self.log_path = spec, target, argv, log_path
        self.message_path = message_path
        self.record = ContainerRecord(name=spec["name"], image=str(spec.get("image", "")))
        self.proc: asyncio.subprocess.Process | None = None
        self.probers: list[asyncio.Task[None]] = []
        self.restart_at: float | None = None
        self.stopping = False
        self.kill_grace_s = MIN_GRACE_S  # a failed liveness/startup probe: the pod's grace period

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.message_path is not None:
            self.message_path.write_text("")  # a new container starts with an empty message
        with open(self.log_path, "ab") as out:
            out.write(f"--- {now_iso()} start: {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv, env=dict(self.target.env), cwd=self.target.cwd, stdin=asyncio.subprocess.DEVNULL,
                stdout=out, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
                preexec_fn=_die_with_parent)
        r = self.record
        r.state, r.reason, r.message, r.pid = "running", "", "", self.proc.pid
        r.started_at, r.exit_code, r.will_restart = now_iso(), None, False
        r.startup_passed = "startupProbe" not in self.spec
        r.readiness = None if "readinessProbe" in self.spec else True
        self.restart_at = None
        self.probers = [asyncio.create_task(self._probe(kind)) for kind in
                        ("startupProbe", "livenessProbe", "readinessProbe") if kind in self.spec]

    def exited(self) -> bool:
        """Fold a finished process into the record (once); True when it just exited."""
        if self.proc is None or self.proc.returncode is None or self.record.state != "running":
            return False
        for t in self.probers:
            t.cancel()
        self.probers = []
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # the rest of the "container" goes with it
        r = self.record
        r.exit_code = exit_code(self.proc.returncode)
        r.state, r.finished_at = "terminated", now_iso()
        r.reason = "Completed" if r.exit_code == 0 else "Error"
        r.message = self.termination_message(r.exit_code)
        return True

    def termination_message(self, code: int) -> str:
        """The file at ``terminationMessagePath``, or the log's tail on failure when the policy
        is ``FallbackToLogsOnError`` (at most 4096 bytes either way)."""
        text = ""
        with contextlib.suppress(OSError):
            if self.message_path is not None:
                text = self.message_path.read_bytes()[:podspec.MESSAGE_BYTES].decode(errors="replace")
        if not text and code != 0 and self.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            with contextlib.suppress(OSError):
                text = self.log_path.read_bytes()[-podspec.MESSAGE_BYTES:].decode(errors="replace")
        return text

    async def _probe(self, kind: str) -> None:
        probe = self.spec[kind]
        timing = ProbeTiming.of(probe)
        state = ProbeState(timing)
        await asyncio.sleep(timing.initial_delay_s)
        while self.running:
            if kind != "startupProbe" and not self.record.startup_passed:
                await asyncio.sleep(TICK_S)
                continue
            ok, message = await probe_once(probe, self.target)
            changed = state.record(ok, message)
            if kind == "startupProbe" and state.result is True:
                self.record.startup_passed = True
                return
            if kind == "readinessProbe" and changed:
                self.record.readiness = state.result
            if kind != "readinessProbe" and state.result is False and not self.stopping:
                log.info("%s %s failed (%s): killing %s", self.record.name, kind, message, self.argv[0])
                self.record.message = f"{kind} failed: {message}"
                asyncio.get_running_loop().create_task(self.stop(self.kill_grace_s))
                return
            await asyncio.sleep(timing.period_s)

    async def stop(self, grace_s: float, run_pre_stop: bool = True) -> None:
        """preStop, SIGTERM, and SIGKILL of the process group once ``grace_s`` is spent."""
        if not self.running or self.proc is None:
            return
        self.stopping = True
        deadline = time.monotonic() + grace_s
        hook = (self.spec.get("lifecycle") or {}).get("preStop")
        if hook and run_pre_stop:
            log.info("%s: preStop %s", self.record.name, await run_hook(hook, self.target,
                                                                         deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self.proc.wait(), max(deadline - time.monotonic(), 0.0))
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            await self.proc.wait()
        self.stopping = False

    def kill_now(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)


class PodWorker:
    """Everything the kubelet does for one pod, from its first sight to its final deletion."""

    def __init__(self, kubelet: ProcessKubelet, pod: dict[str, Any]) -> None:
        self.kubelet, self.pod = kubelet, pod
        meta = pod["metadata"]
        self.ns, self.name, self.uid = meta["namespace"], meta["name"], meta["uid"]
        self.ip = kubelet.ip_for(self.uid)
        self.sandbox = kubelet.root / "pods" / self.ns / f"{self.name}-{self.uid[:8]}"
        self.containers: list[Container] = []
        self.view = PodView(self.ip)
        self.sent: dict[str, Any] | None = None
        self.gone = False
        self.waiting: ContainerRecord | None = None

    # --- what the API says ------------------------------------------------------------------
    def update(self, pod: dict[str, Any]) -> None:
        self.pod = pod

    def vanish(self) -> None:
        self.gone = True

    @property
    def deleting(self) -> bool:
        return self.gone or bool(self.pod["metadata"].get("deletionTimestamp"))

    @property
    def grace_s(self) -> float:
        grace = self.pod["metadata"].get("deletionGracePeriodSeconds")
        if grace is None:
            grace = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
        return max(float(grace), MIN_GRACE_S) if not self.gone else MIN_GRACE_S

    # --- the pod's life ---------------------------------------------------------------------
    async def run(self) -> None:
        try:
            if await self._setup():
                await self._live()
            await self._terminate()
        finally:
            self.kubelet.finished.add(self.uid)
            self.kubelet.workers.pop(self.uid, None)

    async def _setup(self) -> bool:
        """Volumes and processes resolved; retried while the pod is not deleted (Pending)."""
        spec = self.pod.get("spec") or {}
        names = [c["name"] for c in spec.get("containers") or []]
        while not self.deleting:
            try:
                inputs = await podvolumes.prepare(self.kubelet.api, self.pod, self.sandbox, self.ip)
                self.containers = [self._container(c, inputs) for c in spec.get("containers") or []]
                return True
            except (podspec.ContainerConfigError, httpx.HTTPError, OSError) as exc:
                reason = "CreateContainerConfigError"
                if self.waiting is None or self.waiting.message != str(exc):
                    log.warning("%s/%s: %s", self.ns, self.name, exc)
                    await self.kubelet.api.event(self.pod, "Warning", "Failed", str(exc))
                self.waiting = ContainerRecord(names[0] if names else "?", reason=reason, message=str(exc))
                await self._report([self.waiting, *[ContainerRecord(n, reason=reason) for n in names[1:]]])
                await asyncio.sleep(1.0)
        return False

    def _container(self, c: Mapping[str, Any], inputs: podspec.PodInputs) -> Container:
        message = self.sandbox / f"{c['name']}.termination-log"
        message.parent.mkdir(parents=True, exist_ok=True)
        message.write_text("")
        table = podspec.mounts(self.pod, c, inputs, str(message))
        pod_env = podspec.container_env(self.pod, c, self.ip, inputs)
        tmp = next((m.host for m in table if m.path == "/tmp"), str(self.sandbox / "tmp"))
        home = self.sandbox / "home"
        for d in (Path(tmp), home):
            d.mkdir(parents=True, exist_ok=True)
        base = {**self.kubelet.image_env, "HOME": str(home), "TMPDIR": tmp,
                podnet.POD_IP_ENV: self.ip, "PYTHONPATH": str(self.kubelet.podnet_dir)}
        env = podspec.process_env(base, pod_env, table, inputs)
        cwd = podspec.working_dir(c, table, self.sandbox)
        argv = podspec.resolve_argv(c, env, table)
        container = Container(c, Target(self.ip, c, env, cwd, table), argv, self.sandbox / f"{c['name']}.log",
                              message)
        grace = float((self.pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
        container.kill_grace_s = max(grace, MIN_GRACE_S)
        return container

    async def _live(self) -> None:
        policy = (self.pod.get("spec") or {}).get("restartPolicy", "Always")
        for c in self.containers:
            await self._start(c)
        while not self.deleting:
            for c in self.containers:
                if c.exited():
                    await self._on_exit(c, policy)
                if c.restart_at is not None and time.monotonic() >= c.restart_at:
                    await self._start(c)
            await self._report([c.record for c in self.containers])
            if all(c.record.state == "terminated" and not c.record.will_restart for c in self.containers):
                return
            await asyncio.sleep(TICK_S)

    async def _start(self, c: Container) -> None:
        try:
            await c.start()
        except OSError as exc:
            c.record.state, c.record.reason, c.record.message = "waiting", "RunContainerError", str(exc)
            c.record.will_restart = True
            c.restart_at = time.monotonic() + BACKOFF_S[-1]
            await self.kubelet.api.event(self.pod, "Warning", "Failed", f"{c.argv[0]}: {exc}")
            return
        log.info("%s/%s: started %s (pid %s, %s)", self.ns, self.name, c.record.name, c.record.pid, self.ip)
        await self.kubelet.api.event(self.pod, "Normal", "Started", f"Started container {c.record.name} "
                                     f"(pid {c.record.pid} on {self.ip})")

    async def _on_exit(self, c: Container, policy: str) -> None:
        r = c.record
        log.info("%s/%s: %s exited with %s", self.ns, self.name, r.name, r.exit_code)
        again = not self.deleting and (policy == "Always" or (policy == "OnFailure" and r.exit_code != 0))
        if not again:
            return
        r.last_terminated = r.terminated()
        delay = BACKOFF_S[min(r.restart_count, len(BACKOFF_S) - 1)]
        r.restart_count += 1
        r.state, r.reason, r.will_restart = "waiting", "CrashLoopBackOff", True
        r.message = f"back-off {delay:g}s restarting failed container {r.name}"
        c.restart_at = time.monotonic() + delay
        await self.kubelet.api.event(self.pod, "Warning", "BackOff", r.message)

    async def _terminate(self) -> None:
        """Stop every container within the grace period, report the exits, finish the deletion."""
        running = [c for c in self.containers if c.running]
        if running:
            grace = self.grace_s
            log.info("%s/%s: stopping (grace %g s)", self.ns, self.name, grace)
            await self.kubelet.api.event(self.pod, "Normal", "Killing",
                                         f"Stopping container(s) {', '.join(c.record.name for c in running)}")
            await asyncio.gather(*(c.stop(grace) for c in running))
        for c in self.containers:
            c.exited()
            c.record.will_restart = False
            if c.record.state == "waiting" and c.record.restart_count:  # waited for a restart
                c.record.state = "terminated"
                c.record.exit_code = int((c.record.last_terminated or {}).get("exitCode", 0))
        if self.gone:
            return
        if self.containers:
            await self._report([c.record for c in self.containers])
        if self.deleting:
            await self._final_delete()

    async def _report(self, records: list[ContainerRecord]) -> None:
        status = pod_status(records, self.view, self.sent)
        if status == self.sent or self.gone:
            return
        code = await self.kubelet.api.merge_patch(
            f"/api/v1/namespaces/{self.ns}/pods/{self.name}/status", {"status": status})
        if code == 200:
            self.sent = status
        elif code == 404:
            self.gone = True

    async def _final_delete(self) -> None:
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0,
                "preconditions": {"uid": self.uid}}
        r = await self.kubelet.api.client.request("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{self.name}",
                                                  content=json.dumps(body),
                                                  headers={"Content-Type": "application/json"})
        if r.status_code not in (200, 404, 409):
            log.warning("delete %s/%s: HTTP %s %s", self.ns, self.name, r.status_code, r.text[:200])

    async def shutdown(self, grace_s: float) -> None:
        await asyncio.gather(*(c.stop(grace_s, run_pre_stop=False) for c in self.containers if c.running))
        for c in self.containers:
            c.kill_now()


class ProcessKubelet:
    """Registers its nodes and runs a :class:`PodWorker` for every pod bound to one of them."""

    def __init__(self, api: KubeApi, nodes: list[dict[str, Any]], root: Path, ip_prefix: str) -> None:
        self.api, self.root, self.ip_prefix = api, root, ip_prefix
        self.nodes = {n["name"]: n for n in nodes}
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()  # uids whose worker ended: a stale event never reruns them
        self.finishing: set[str] = set()  # finished pods whose deletion this kubelet completes
        self.tasks: set[asyncio.Task[None]] = set()
        self.ips: dict[str, str] = {}
        self.podnet_dir = root / "podnet"
        podnet.install_file(self.podnet_dir)
        bin_dir = str(Path(sys.executable).parent)
        self.image_env = {"PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/bin:/bin")]),
                          "LANG": "C.UTF-8", "PYTHONSAFEPATH": "1", "PYTHONUNBUFFERED": "1"}

    def ip_for(self, uid: str) -> str:
        """The pod's address: ``PREFIX.(128 + n // 250).(n % 250 + 1)`` (the fake kubelet of the
        same control plane hands out the blocks below 128)."""
        if uid not in self.ips:
            n = len(self.ips)
            self.ips[uid] = f"{self.ip_prefix}.{FIRST_BLOCK + n // 250}.{n % 250 + 1}"
        return self.ips[uid]

    async def register_nodes(self) -> None:
        for spec in self.nodes.values():
            r = await self.api.client.post("/api/v1/nodes", json=node_object(spec))
            if r.status_code not in (201, 409):
                raise RuntimeError(f"node {spec['name']}: HTTP {r.status_code} {r.text[:300]}")
            await self.api.merge_patch(f"/api/v1/nodes/{spec['name']}/status", node_status())
            # The API server taints a new node not-ready; nothing lifts it (node lifecycle is off).
            await self.api.merge_patch(f"/api/v1/nodes/{spec['name']}",
                                       {"spec": {"taints": list(spec["taints"])}})

    def on_pod(self, pod: dict[str, Any], deleted: bool = False) -> None:
        uid = pod["metadata"]["uid"]
        worker = self.workers.get(uid)
        if deleted:
            if worker is not None:
                worker.vanish()
            return
        if worker is not None:
            worker.update(pod)
            return
        phase = (pod.get("status") or {}).get("phase")
        if uid in self.finished or phase in ("Succeeded", "Failed"):
            if pod["metadata"].get("deletionTimestamp") and uid not in self.finishing:
                self.finishing.add(uid)  # a finished pod deleted: nothing runs, finish the deletion
                self._spawn(PodWorker(self, pod)._final_delete())
            return
        worker = self.workers[uid] = PodWorker(self, pod)
        self._spawn(worker.run())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _events(self, node: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """List then watch the pods bound to ``node``, forever (a re-list after each short watch)."""
        params = {"fieldSelector": f"spec.nodeName={node}"}
        while True:
            try:
                r = await self.api.client.get("/api/v1/pods", params=params)
                r.raise_for_status()
                body = r.json()
                listed = {p["metadata"]["uid"] for p in body.get("items") or []}
                for uid, w in list(self.workers.items()):
                    if w.pod["spec"].get("nodeName") == node and uid not in listed:
                        yield "DELETED", w.pod
                for item in body.get("items") or []:
                    yield "ADDED", item
                watch = {**params, "watch": "1", "resourceVersion": body["metadata"]["resourceVersion"],
                         "timeoutSeconds": "30", "allowWatchBookmarks": "false"}
                async with self.api.client.stream("GET", "/api/v1/pods", params=watch, timeout=None) as resp:
                    async for line in resp.aiter_lines():
                        if line:
                            ev = json.loads(line)
                            if ev.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                                yield ev["type"], ev["object"]
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                log.warning("watch pods on %s: %r", node, exc)
                await asyncio.sleep(0.5)

    async def _watch(self, node: str) -> None:
        async for kind, pod in self._events(node):
            self.on_pod(pod, deleted=kind == "DELETED")

    async def run(self, stop: asyncio.Event) -> None:
        await self.register_nodes()
        watches = [asyncio.create_task(self._watch(n)) for n in self.nodes]
        await stop.wait()
        workers = list(self.workers.values())
        for t in [*watches, *self.tasks]:
            t.cancel()  # no worker restarts or reports a container from here on
        await asyncio.gather(*watches, *self.tasks, return_exceptions=True)
        await asyncio.gather(*(w.shutdown(5.0) for w in workers), return_exceptions=True)
        await self.api.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kubeconfig", type=Path, required=True)
    ap.add_argument("--nodes", type=Path, required=True, help="JSON list of FakeNode fields")
    ap.add_argument("--root", type=Path, required=True, help="pod sandboxes and logs go here")
    ap.add_argument("--pod-ip-prefix", default="127.78", help="pod IPs are PREFIX.X.Y (loopback)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        kubelet = ProcessKubelet(KubeApi.from_kubeconfig(args.kubeconfig), json.loads(args.nodes.read_text()),
                                 args.root, args.pod_ip_prefix)
        await kubelet.run(stop)

    asyncio.run(serve())


if __name__ == "__main__":
    main()

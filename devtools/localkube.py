"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler.

For the real-control-plane tests and for trying the chart on a laptop, like
:mod:`ttsfleet.devtools.localcluster` for Slurm. The binaries are built once from the pinned
``k8s.io/kubernetes`` release by ``scripts/kube-local.sh build`` and cached outside the repo
(``$TTSFLEET_KUBE_CACHE``, default ``/var/cache/ttsfleet/kube``). There is no real kubelet: GPU
nodes are API objects and :mod:`ttsfleet.devtools.fakekubelet` plays kubelet for them (pod status,
exit codes, graceful-deletion completion), or for nodes with ``FakeNode(processes=True)``
:mod:`ttsfleet.devtools.kubelet` runs their pods' containers as local processes.

Everything lives under one directory (certs, etcd data, kubeconfigs, logs), every port is picked
free on 127.0.0.1, and :meth:`LocalKube.stop` (also registered with :mod:`atexit`) stops the
processes this object started, by their pids. The API server runs with ``--authorization-mode=RBAC``
and ``OwnerReferencesPermissionEnforcement``, as a hardened cluster does: the operator's tests use
a real ServiceAccount token (TokenRequest), so every call it makes is authorized like in production.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ttsfleet.devtools.ports import free_port

from ttsfleet.catalog import NODE_LABEL_KEY

#: The pinned release (scripts/kube-local/go.mod requires the same; a test checks they agree).
K8S_VERSION = "v1.34.4"
BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd")
DEFAULT_CACHE = "/var/cache/ttsfleet/kube"
ADMISSION = ("NamespaceLifecycle,ServiceAccount,Priority,DefaultTolerationSeconds,"
             "ResourceQuota,OwnerReferencesPermissionEnforcement")
#: Controllers the tests need; node lifecycle is off (fake nodes have no heartbeat to watch).
CONTROLLERS = ",".join(f"{c}-controller" for c in (
    "deployment", "replicaset", "garbage-collector", "disruption", "serviceaccount", "namespace",
    "endpointslice", "pod-garbage-collector", "root-ca-certificate-publisher", "clusterrole-aggregation",
    "persistentvolume-binder", "horizontal-pod-autoscaler"))


#: Requests by ServiceAccounts (the operator under test) are recorded, nothing else.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                          {"level": "None"}]}


class LocalKubeError(RuntimeError):
    """The control plane could not be started (the message carries the log tail)."""


def cache_dir() -> Path:
    return Path(os.environ.get("TTSFLEET_KUBE_CACHE") or DEFAULT_CACHE)


def bin_dir() -> Path:
    """Where ``scripts/kube-local.sh build`` puts the binaries (``$TTSFLEET_KUBE_BIN`` overrides)."""
    return Path(os.environ.get("TTSFLEET_KUBE_BIN") or cache_dir() / f"bin-{K8S_VERSION}")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir() / b, os.X_OK)]



@dataclass(frozen=True)
class FakeNode:
    """A GPU node that exists only as an API object: the fake kubelet plays its pods, or with
    ``processes=True`` :mod:`ttsfleet.devtools.kubelet` runs their containers as local processes."""

    name: str
    labels: dict[str, str] = field(default_factory=dict)
    gpus: int = 8
    cpu: str = "64"
    memory: str = "512Gi"
    taints: tuple[dict[str, str], ...] = ()
    processes: bool = False


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started us dies (Linux), so a killed
    test run leaves no control plane behind even when atexit never runs."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: Path) -> None:
    """A CA, the API server's serving cert (127.0.0.1, localhost) and the ServiceAccount key pair."""
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
             "-days", "2", "-subj", "/CN=ttsfleet-local-ca", cwd=d)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=d)
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\n")
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "apiserver.crt", "-days", "2", "-extfile", "san.ext", cwd=d)
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def kubeconfig_text(server: str, ca_file: Path, token: str, user: str) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": user,
        "clusters": [{"name": "local", "cluster": {"server": server,
                                                   "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "local", "user": user}}],
    }, indent=1)


class LocalKube:
    """One control plane under ``root``; :meth:`start` blocks until it serves and schedules."""

    def __init__(self, root: Path, nodes: Sequence[FakeNode] = (), *, verbosity: int = 0,
                 controller_args: Sequence[str] = ()) -> None:
        self.root = root
        self.nodes = list(nodes)
        self.verbosity = verbosity
        self.controller_args = list(controller_args)  # more controller-manager flags (sync periods)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.admin_token = secrets.token_hex(16)
        self.api_port = 0
        # Pod IPs on a loopback /16 of their own: two control planes on one machine (two test
        # sessions) never bind the same pod IP and port.
        self.pod_ip_prefix = f"127.{secrets.choice([n for n in range(16, 250) if n != 77])}"
        atexit.register(self.stop)

    # --- paths and clients ----------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        return self.root / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.root / "logs" / "audit.jsonl"

    def audit_events(self) -> list[dict[str, Any]]:
        """Every request a ServiceAccount made so far, as the API server recorded it (verb,
        objectRef, responseStatus): the ground truth for RBAC and for counting PATCHes/Events."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"

    def write_kubeconfig(self, path: Path, token: str, user: str) -> Path:
        path.write_text(kubeconfig_text(self.url, self.ca_file, token, user))
        return path

    def request(self, method: str, path: str, body: Any = None, token: str | None = None,
                content_type: str = "application/json") -> tuple[int, Any]:
        """A plain HTTPS call as the admin (or ``token``); returns (status, parsed body)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.admin_token}", "Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=30) as resp:
                code, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            code, raw = exc.code, exc.read()
        try:
            return code, json.loads(raw) if raw else None
        except ValueError:  # /readyz and friends answer plain text
            return code, raw.decode(errors="replace")

    def service_account_token(self, namespace: str, name: str, seconds: int = 7200) -> str:
        """A real bound token for a ServiceAccount (TokenRequest), as a pod would mount it."""
        code, body = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                  {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                   "spec": {"expirationSeconds": seconds}})
        if code != 201:
            raise LocalKubeError(f"TokenRequest for {namespace}/{name}: HTTP {code}: {body}")
        return str(body["status"]["token"])

    # --- lifecycle --------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.log(name).parent.mkdir(parents=True, exist_ok=True)
        out = open(self.log(name), "ab")  # noqa: SIM115 - handed to the child, closed with it
        self.procs[name] = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.root,
                                            env={**os.environ, **(env or {})}, start_new_session=True,
                                            preexec_fn=_die_with_parent)
        out.close()

    def _tail(self, name: str, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        return ""

    def _wait(self, what: str, name: str, ok: Any, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            proc = self.procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise LocalKubeError(f"{name} exited with {proc.returncode}:\n{self._tail(name)}")
            with contextlib.suppress(OSError, ValueError, ssl.SSLError):
                if ok():
                    return
            time.sleep(0.2)
        raise LocalKubeError(f"timed out waiting for {what}:\n{self._tail(name)}")

    def start(self, timeout: float = 120.0) -> LocalKube:
        missing = missing_binaries()
        if missing:
            raise LocalKubeError(f"missing {', '.join(missing)} in {bin_dir()}: "
                                 "run scripts/kube-local.sh build")
        self.root.mkdir(parents=True, exist_ok=True)
        pki = self.root / "pki"
        make_certs(pki)
        self._start_etcd(timeout)
        self._start_apiserver(pki, timeout)
        admin = self.write_kubeconfig(self.admin_kubeconfig, self.admin_token, "admin")
        v = str(self.verbosity)
        self._spawn("kube-controller-manager", [
            str(bin_dir() / "kube-controller-manager"), f"--kubeconfig={admin}",
            "--secure-port=0", "--leader-elect=false", f"--controllers={CONTROLLERS}",
            f"--root-ca-file={pki / 'ca.crt'}", "--concurrent-gc-syncs=5",
            "--node-monitor-grace-period=3600s", f"-v={v}", *self.controller_args])
        self._spawn("kube-scheduler", [
            str(bin_dir() / "kube-scheduler"), f"--kubeconfig={admin}", "--secure-port=0",
            "--leader-elect=false", f"-v={v}"])
        default_sa = "/api/v1/namespaces/default/serviceaccounts/default"
        self._wait("the 'default' ServiceAccount (controller-manager up)", "kube-controller-manager",
                   lambda: self.request("GET", default_sa)[0] == 200, timeout)
        self._start_kubelet()
        return self

    def _start_etcd(self, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [
            str(bin_dir() / "etcd"), "--name=local", f"--data-dir={self.root / 'etcd'}",
            f"--listen-client-urls={self.etcd_url}", f"--advertise-client-urls={self.etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=local=http://127.0.0.1:{peer}", "--unsafe-no-fsync",
            "--log-level=warn", "--quota-backend-bytes=2147483648"])

        def healthy() -> bool:
            with urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2) as resp:
                return bool(json.loads(resp.read()).get("health") == "true")
        self._wait("etcd /health", "etcd", healthy, timeout)

    def _start_apiserver(self, pki: Path, timeout: float) -> None:
        self.api_port = free_port()
        tokens = self.root / "tokens.csv"
        tokens.write_text(f'{self.admin_token},admin,admin-uid,"system:masters"\n')
        policy = self.root / "audit-policy.json"
        policy.write_text(json.dumps(AUDIT_POLICY))
        self._spawn("kube-apiserver", [
            str(bin_dir() / "kube-apiserver"), f"--etcd-servers={self.etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={tokens}",
            "--authorization-mode=RBAC", f"--enable-admission-plugins={ADMISSION}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            "--service-cluster-ip-range=10.96.0.0/16", "--endpoint-reconciler-type=none",
            "--enable-priority-and-fairness=false", "--profiling=false", "--allow-privileged=true",
            f"--audit-policy-file={policy}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking",
            f"--cert-dir={pki}", f"-v={self.verbosity}"])
        self._wait("kube-apiserver /readyz", "kube-apiserver",
                   lambda: self.request("GET", "/readyz")[0] == 200, timeout)

    @property
    def kubelet_root(self) -> Path:
        """Where the process kubelet keeps pod sandboxes and container logs (``pods/NS/POD-UID/``)."""
        return self.root / "kubelet"

    def _start_kubelet(self) -> None:
        fake = [asdict(n) for n in self.nodes if not n.processes]
        real = [asdict(n) for n in self.nodes if n.processes]
        if fake or not real:
            spec = self.root / "nodes.json"
            spec.write_text(json.dumps(fake))
            self._spawn("fake-kubelet", [sys.executable, "-P", "-m", "ttsfleet.devtools.fakekubelet",
                                         "--kubeconfig", str(self.admin_kubeconfig), "--nodes", str(spec),
                                         "--pod-ip-prefix", self.pod_ip_prefix])
        if real:
            spec = self.root / "process-nodes.json"
            spec.write_text(json.dumps(real))
            self._spawn("kubelet", [sys.executable, "-P", "-m", "ttsfleet.devtools.kubelet",
                                    "--kubeconfig", str(self.admin_kubeconfig), "--nodes", str(spec),
                                    "--root", str(self.kubelet_root), "--pod-ip-prefix", self.pod_ip_prefix])
        want = {n.name for n in self.nodes}

        def registered() -> bool:
            code, body = self.request("GET", "/api/v1/nodes")
            ready = {n["metadata"]["name"] for n in body.get("items", [])
                     if any(c["type"] == "Ready" and c["status"] == "True"
                            for c in (n.get("status") or {}).get("conditions") or [])}
            return code == 200 and want <= ready
        self._wait("the nodes", "kubelet" if real else "fake-kubelet", registered, 60)

    def stop(self) -> None:
        """Stop what this object started, newest first, by pid (TERM, then KILL)."""
        for name in reversed(list(self.procs)):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m ttsfleet.devtools.localkube DIR``: run a control plane with 2 h200 + 2 rtx5090
    fake nodes until Ctrl-C (``scripts/kube-local.sh up`` calls this)."""
    args = list(sys.argv[1:] if argv is None else argv)
    root = Path(args[0] if args else "kube-local").resolve()
    nodes = [FakeNode(f"{cls}-{i}", {NODE_LABEL_KEY: cls}, gpus=8) for cls in ("h200", "rtx5090")
             for i in range(2)]
    kube = LocalKube(root, nodes)
    try:
        kube.start()
        print(f"control plane up: export KUBECONFIG={kube.admin_kubeconfig}", flush=True)
        while all(p.poll() is None for p in kube.procs.values()):
            time.sleep(1)
        print("a control-plane process exited; see", root / "logs", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except LocalKubeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        kube.stop()


if __name__ == "__main__":
    raise SystemExit(main())

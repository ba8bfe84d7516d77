"""The whole loop on one machine: the operator, real servers and real fill jobs, driven by traffic.

What ``ttsfleet demo`` and ``tests/loop`` run, in this order (:func:`run_loop`):

1. a real control plane (:class:`~ttsfleet.devtools.localkube.LocalKube`) whose GPU nodes are
   labelled fake nodes run by the process kubelet (:mod:`ttsfleet.devtools.kubelet`): two GPU
   classes and a CPU node for the operator;
2. a small real speech corpus (espeak-ng, ``ttsfleet fill corpus``) on a hostPath volume, and a
   checkpoint volume, as bound PVCs;
3. the chart installed with the real Helm SDK: the operator runs as the chart's Deployment (a
   process under the kubelet, with its ServiceAccount's token);
4. the TTSDeployment (``ttsfleet serve`` replicas of the tiny model on CPU) and the FillJob
   (``ttsfleet fill run`` shards) from their manifests;
5. an open-loop traffic trace replayed against the deployment's Service
   (:mod:`ttsfleet.devtools.traffic`) while :class:`~ttsfleet.devtools.looprecord.ClusterRecorder`
   records pods, replicas and Events;
6. after the trace: until fill is complete and the pools have scaled down (bounded);
7. cleanup: the custom resources deleted while the operator runs, the chart uninstalled, the
   control plane stopped (:func:`teardown`).

Nothing here decides or measures for the operator: the servers' own ``/metrics`` drive the
autoscaler, the operator's fill controller evicts, the servers drain on SIGTERM, the fill job
checkpoints and exits 99. This module only sets the stage and writes down what happened.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from ttsfleet.devtools.localkube import FakeNode, LocalKube
from ttsfleet.devtools.looprecord import ClusterRecorder
from ttsfleet.devtools.traffic import RequestRecord, ServiceEndpoints, admin_client, arrivals, replay
from ttsfleet.devtools.wait import wait_for_async

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
CHART = REPO / "charts" / "ttsfleet"


def find_chart(given: Path | None = None) -> Path:
    """The Helm chart: ``given``, else the checkout's (an editable install), else
    ``./charts/ttsfleet`` (``pip install .`` run from a clone; the wheel carries no chart)."""
    for candidate in ([given] if given is not None else [CHART, Path.cwd() / "charts" / "ttsfleet"]):
        if (candidate / "Chart.yaml").is_file():
            return candidate
    raise FileNotFoundError(f"no Helm chart at {given or CHART}: run from the repository's root or pass "
                            "--chart")


NS, RELEASE, RELEASE_NS = "tts", "ttsfleet", "ttsfleet"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
CLASS_LABEL = "ttsfleet.io/gpu-class"
API = "/apis/ttsfleet.io/v1alpha1/namespaces"
DEMO_TTSDEPLOYMENT, DEMO_FILLJOB = HERE / "demo-ttsdeployment.yaml", HERE / "demo-filljob.yaml"


def default_nodes() -> list[FakeNode]:
    """Two GPU classes, three GPUs each, and a CPU node for the operator: all run by the kubelet."""
    return [FakeNode("h200-0", {CLASS_LABEL: "h200"}, gpus=3, taints=(GPU_TAINT,), processes=True),
            FakeNode("rtx5090-0", {CLASS_LABEL: "rtx5090"}, gpus=3, taints=(GPU_TAINT,), processes=True),
            FakeNode("cpu-0", {}, gpus=0, processes=True)]


def load_manifest(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") not in ("TTSDeployment", "FillJob"):
        raise ValueError(f"{path}: expected one TTSDeployment or FillJob")
    doc.setdefault("metadata", {})["namespace"] = NS
    return doc


@dataclass
class LoopContext:
    """What a hook running alongside the trace can see: the API, the recorder, the Service."""

    api: httpx.AsyncClient
    recorder: ClusterRecorder
    endpoints: ServiceEndpoints
    trace_start_s: float
    ttsdeployment: dict[str, Any]

    def trace_time(self) -> float:
        return self.recorder.now() - self.trace_start_s


Hook = Callable[[LoopContext], Awaitable[Any]]


@dataclass
class LoopConfig:
    workdir: Path
    ttsdeployment: dict[str, Any] = field(default_factory=lambda: load_manifest(DEMO_TTSDEPLOYMENT))
    filljob: dict[str, Any] = field(default_factory=lambda: load_manifest(DEMO_FILLJOB))
    trace: Path = HERE / "demo-trace.csv"
    chart: Path | None = None  # default: find_chart()
    corpus_items: int = 40
    seed: int = 0
    nodes: list[FakeNode] = field(default_factory=default_nodes)
    operator_args: tuple[str, ...] = ("--autoscale-interval", "2", "--fill-interval", "1")
    #: More of the chart's ``operator.*`` values (tests: the readiness probe's period).
    operator_values: dict[str, Any] = field(default_factory=dict)
    #: More kube-controller-manager flags (:class:`LocalKube`'s ``controller_args``; tests: sync periods).
    controller_args: tuple[str, ...] = ()
    #: After the trace: how long to wait for fill to complete and the pools to scale down.
    settle_timeout_s: float = 120.0
    #: Run alongside the trace (a test's own probes); their results land in ``LoopRun.hooks``.
    hooks: dict[str, Hook] = field(default_factory=dict)
    log: Callable[[str], None] = print


@dataclass
class LoopRun:
    """Everything a run recorded; :mod:`ttsfleet.devtools.loopreport` summarizes and plots it."""

    config: dict[str, Any]
    requests: list[RequestRecord]
    recorder: dict[str, Any]
    ttsdeployment: dict[str, Any]
    filljob: dict[str, Any]
    fill_report: dict[str, Any]
    fill_logs: dict[str, list[dict[str, Any]]]
    phases_s: dict[str, float]
    trace_start_s: float
    output_dir: str
    checkpoint_dir: str
    hooks: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config, "requests": [r.to_dict() for r in self.requests],
                "recorder": self.recorder, "ttsdeployment": self.ttsdeployment, "filljob": self.filljob,
                "fill_report": self.fill_report, "fill_logs": self.fill_logs, "phases_s": self.phases_s,
                "trace_start_s": self.trace_start_s, "output_dir": self.output_dir,
                "checkpoint_dir": self.checkpoint_dir,
                "hooks": {k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in self.hooks.items()}}


# --- the stage ------------------------------------------------------------------------------------
def make_corpus(directory: Path, items: int, seed: int) -> Path:
    from ttsfleet.fill_jobs.corpus import make_corpus as synthesize

    return synthesize(directory, items, seed=seed)


async def host_volume(api: httpx.AsyncClient, name: str, path: Path) -> None:
    """A hostPath PersistentVolume pre-bound to a ReadWriteMany claim ``name`` in the namespace."""
    path.mkdir(parents=True, exist_ok=True)
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{NS}-{name}"},
          "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                   "hostPath": {"path": str(path)}, "claimRef": {"namespace": NS, "name": name}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{NS}-{name}",
                    "resources": {"requests": {"storage": "1Gi"}}}}
    claims = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
    for url, body in (("/api/v1/persistentvolumes", pv), (claims, pvc)):
        r = await api.post(url, json=body)
        if r.status_code not in (201, 409):
            raise RuntimeError(f"create {body['kind']} {name}: HTTP {r.status_code} {r.text[:300]}")

    async def bound() -> bool:
        r = await api.get(f"/api/v1/namespaces/{NS}/persistentvolumeclaims/{name}")
        return r.status_code == 200 and (r.json().get("status") or {}).get("phase") == "Bound"
    await wait_for_async(bound, 60, f"PVC {NS}/{name} Bound")


async def namespace(api: httpx.AsyncClient, name: str) -> None:
    r = await api.post("/api/v1/namespaces", json={"apiVersion": "v1", "kind": "Namespace",
                                                    "metadata": {"name": name}})
    if r.status_code not in (201, 409):
        raise RuntimeError(f"namespace {name}: HTTP {r.status_code} {r.text[:300]}")

    async def has_sa() -> bool:
        return (await api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")).status_code == 200
    await wait_for_async(has_sa, 60, f"the default ServiceAccount in {name}")


def install_chart(kube: LocalKube, operator_args: tuple[str, ...], chart_dir: Path,
                  operator_values: dict[str, Any] | None = None) -> None:
    """``helm install ttsfleet charts/ttsfleet -n ttsfleet`` with the operator running (1 replica);
    ``operator_values``: more of the chart's ``operator.*`` values."""
    import helm_python as helm

    values = {"operator": {"replicas": 1, "extraArgs": list(operator_args), **(operator_values or {})}}
    with helm.Config(kubeconfig_path=str(kube.admin_kubeconfig), namespace=RELEASE_NS) as cfg, \
            helm.Chart.load(chart_dir) as chart:
        cfg.install(chart, RELEASE, values, namespace=RELEASE_NS, create_namespace=True, wait="watcher",
                    timeout=180)


def uninstall_chart(kube: LocalKube) -> None:
    import helm_python as helm

    with helm.Config(kubeconfig_path=str(kube.admin_kubeconfig), namespace=RELEASE_NS) as cfg:
        cfg.uninstall(RELEASE, wait="watcher", timeout=120)


def plural(doc: dict[str, Any]) -> str:
    return {"TTSDeployment": "ttsdeployments", "FillJob": "filljobs"}[doc["kind"]]


async def apply(api: httpx.AsyncClient, doc: dict[str, Any]) -> None:
    r = await api.post(f"{API}/{NS}/{plural(doc)}", json=doc)
    if r.status_code != 201:
        raise RuntimeError(f"create {doc['kind']} {doc['metadata']['name']}: HTTP {r.status_code} "
                           f"{r.text[:500]}")


async def get(api: httpx.AsyncClient, path: str) -> dict[str, Any]:
    r = await api.get(path)
    return r.json() if r.status_code == 200 else {}


# --- waiting for the cluster -----------------------------------------------------------------------
def inference_floor_ready(rec: ClusterRecorder, floor: dict[str, int]) -> bool:
    s = rec.samples[-1] if rec.samples else None
    return s is not None and all(s.ready.get(p, 0) >= n for p, n in floor.items()) and bool(s.ready)


def settled(rec: ClusterRecorder, fill: dict[str, Any]) -> bool:
    """Fill complete, and the pools scaled down from their peak and steady (desired == ready)."""
    conds = {c["type"]: c["status"] for c in (fill.get("status") or {}).get("conditions") or []}
    if conds.get("Complete") != "True" or not rec.samples:
        return False
    last = rec.samples[-1]
    peak = max(sum(s.desired.values()) for s in rec.samples)
    steady = all(last.ready.get(p, 0) == n for p, n in last.desired.items())
    return sum(last.desired.values()) < peak and steady


def pool_floor(ttsd: dict[str, Any]) -> dict[str, int]:
    return {p.get("name") or p["gpuClass"]: int(p.get("minReplicas", 1)) for p in ttsd["spec"]["pools"]}


def read_fill_logs(kube: LocalKube, job: str) -> dict[str, list[dict[str, Any]]]:
    """The fill containers' JSON event lines (``started``, ``checkpoint``, ``preempted``, ...) per pod."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((kube.kubelet_root / "pods" / NS).glob(f"{job}-*/fill.log")):
        events = []
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    events.append(json.loads(line))
        out[path.parent.name] = events
    return out


# --- the run ----------------------------------------------------------------------------------------
async def run_loop(cfg: LoopConfig) -> LoopRun:
    """Bring the stage up, replay the trace, settle, record; always tear down."""
    phases: dict[str, float] = {}
    mark = time.monotonic()

    def phase(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        phases[name] = round(now - mark, 1)
        mark = now

    cfg.workdir.mkdir(parents=True, exist_ok=True)
    data, ckpt = cfg.workdir / "data", cfg.workdir / "checkpoints"
    ttsd, job = cfg.ttsdeployment, cfg.filljob
    from ttsfleet.sim.trace import load_csv

    schedule = arrivals(load_csv(cfg.trace), seed=cfg.seed)
    cfg.log(f"corpus: {cfg.corpus_items} utterances with espeak-ng")
    await asyncio.to_thread(make_corpus, data / "corpus", cfg.corpus_items, cfg.seed)
    kube = LocalKube(cfg.workdir / "kube", cfg.nodes, controller_args=cfg.controller_args)
    cfg.log("control plane: etcd, kube-apiserver, controller-manager, scheduler, process kubelet")
    try:
        await asyncio.to_thread(kube.start)
        phase("control_plane")
        async with admin_client(kube.url, str(kube.ca_file), kube.admin_token) as api:
            cfg.log("chart: helm install ttsfleet (the operator runs as its pod)")
            await asyncio.to_thread(install_chart, kube, cfg.operator_args, find_chart(cfg.chart),
                                    cfg.operator_values)
            phase("chart")
            await namespace(api, NS)
            await host_volume(api, "demo-data", data)
            await host_volume(api, "demo-checkpoints", ckpt)
            rec = ClusterRecorder(api, NS, checkpoints=ckpt / job["metadata"]["name"]).start()
            try:
                return await _drive(cfg, kube, api, rec, ttsd, job, schedule, phases, phase, data, ckpt)
            finally:
                await rec.stop()
                cfg.log("cleanup: delete the TTSDeployment and the FillJob, uninstall the chart")
                await teardown(kube, api, ttsd, job)
    finally:
        await asyncio.to_thread(kube.stop)


async def _drive(cfg: LoopConfig, kube: LocalKube, api: httpx.AsyncClient, rec: ClusterRecorder,
                 ttsd: dict[str, Any], job: dict[str, Any], schedule: list[tuple[float, int]],
                 phases: dict[str, float], phase: Callable[[str], None], data: Path, ckpt: Path) -> LoopRun:
    floor = pool_floor(ttsd)
    cfg.log(f"apply: TTSDeployment {ttsd['metadata']['name']} (pools {floor}) and FillJob "
            f"{job['metadata']['name']} ({job['spec']['shards']} shards)")
    await apply(api, ttsd)
    await wait_for_async(lambda: inference_floor_ready(rec, floor), 180, "the pools' first replicas Ready")
    await apply(api, job)
    await wait_for_async(lambda: any(s.fill_running for s in rec.samples[-1:]), 120,
                         "fill pods Running on the idle GPUs")
    phase("first_replicas")
    trace_start = rec.now()
    cfg.log(f"traffic: {len(schedule)} requests over {schedule[-1][0]:.0f} s, open loop, "
            f"to Service {NS}/{ttsd['metadata']['name']}")
    async with ServiceEndpoints(api, NS, ttsd["metadata"]["name"]) as endpoints:
        ctx = LoopContext(api, rec, endpoints, trace_start, ttsd)
        hooks = {name: asyncio.create_task(hook(ctx)) for name, hook in cfg.hooks.items()}
        requests = await replay(endpoints, schedule, seed=cfg.seed)
        hook_results = {name: await task for name, task in hooks.items()}
    phase("trace")
    name, jname = ttsd["metadata"]["name"], job["metadata"]["name"]

    async def done() -> bool:
        return settled(rec, await get(api, f"{API}/{NS}/filljobs/{jname}"))
    cfg.log("settle: until fill is complete and the pools have scaled down")
    with contextlib.suppress(AssertionError):
        await wait_for_async(done, cfg.settle_timeout_s, "fill complete and the pools scaled down", step=1.0)
    phase("settle")
    return LoopRun(
        config={"ttsdeployment": ttsd, "filljob": job, "trace": str(cfg.trace), "seed": cfg.seed,
                "corpus_items": cfg.corpus_items, "nodes": [asdict(n) for n in cfg.nodes]},
        requests=requests, recorder=rec.to_dict(),
        ttsdeployment=await get(api, f"{API}/{NS}/ttsdeployments/{name}"),
        filljob=await get(api, f"{API}/{NS}/filljobs/{jname}"),
        fill_report=fill_report(ckpt), fill_logs=read_fill_logs(kube, jname), phases_s=dict(phases),
        trace_start_s=trace_start, output_dir=str(data / "cleaned"), checkpoint_dir=str(ckpt / jname),
        hooks=hook_results)


def fill_report(ckpt: Path) -> dict[str, Any]:
    from ttsfleet.fill_jobs.status import status_report

    reports = [status_report(d) for d in sorted(ckpt.glob("*/")) if d.is_dir()]
    return reports[0] if len(reports) == 1 else {"jobs": reports}


async def teardown(kube: LocalKube, api: httpx.AsyncClient, ttsd: dict[str, Any],
                   job: dict[str, Any]) -> None:
    """Delete the custom resources while the operator runs (its finalizers), then the chart."""
    for doc in (ttsd, job):
        with contextlib.suppress(httpx.HTTPError):
            await api.delete(f"{API}/{NS}/{plural(doc)}/{doc['metadata']['name']}")

    async def empty() -> bool:
        pods = (await api.get(f"/api/v1/namespaces/{NS}/pods")).json().get("items") or []
        crs = [(await api.get(f"{API}/{NS}/{plural(d)}/{d['metadata']['name']}")).status_code
               for d in (ttsd, job)]
        return not pods and all(code == 404 for code in crs)
    with contextlib.suppress(AssertionError, httpx.HTTPError):
        await wait_for_async(empty, 90, "the demo's pods and resources gone", step=0.5)
    with contextlib.suppress(Exception):  # the control plane stops next either way
        await asyncio.to_thread(uninstall_chart, kube)

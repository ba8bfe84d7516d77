"""Operator memory and API traffic at 5,000 pods: LIST every pass (before) vs watch caches (now).

Run:  nice python -P benchmarks/operator/bench_watch_memory.py [--pods 5000] [--out benchmarks/operator]

Starts the local control plane (devtools/localkube.py: etcd, kube-apiserver, controller-manager,
scheduler, fake kubelet) on free loopback ports under a temp dir, registers GPU nodes, creates
``--pods`` inference-like pods bound to them (one GPU each, every GPU taken, so the steady state
admits nothing), waits until the fake kubelet reports them Running, then stops the fake kubelet
(nothing changes while measuring). One TTSDeployment (minReplicas 0) and one FillJob make the
autoscaler and the fill controller run at their shipped intervals (15 s, 10 s) next to the GPU
inventory loop (10 s).

Each mode runs the operator in its own process (benchmarks/operator/run_operator.py), one after
the other against the same cluster: ``list`` (the old path: every pass LISTs the pods and nodes
it reads) and ``watch`` (operator/informer.py). Measured: the process's RSS from /proc (VmRSS,
what the kernel reports), sampled each second; API requests and bytes received per minute over
the steady window (after ``--warmup`` seconds). Prints a table, writes results-<date>.json and
watch-memory.png.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from ttsfleet.devtools.localkube import FakeNode, LocalKube, missing_binaries

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
NS = "bench"
LIMIT_MIB = 512  # charts/ttsfleet/values.yaml: operator.resources.limits.memory


def pod_body(i: int, node: str) -> dict[str, Any]:
    """An inference-like pod: labels, a container with env, ports, probes and resources."""
    env = [{"name": f"TTSFLEET_SETTING_{k}", "value": f"value-{k}-{i}"} for k in range(12)]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"load-{i:05d}", "namespace": NS,
                         "labels": {"app.kubernetes.io/name": "ttsfleet-inference",
                                    "app.kubernetes.io/instance": "load", "ttsfleet.io/pool": "h200",
                                    "ttsfleet.io/workload": "inference", "ttsfleet.io/gpu-class": "h200",
                                    "pod-template-hash": "5d8f7c9b6"},
                         "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}},
            "spec": {"nodeName": node,
                     "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                     "containers": [{
                         "name": "inference", "image": "ghcr.io/ttsfleet/ttsfleet-inference:0.1.0",
                         "args": ["serve", "--model", "/models/narrator-en/v3"], "env": env,
                         "ports": [{"name": "http", "containerPort": 8000}],
                         "resources": {"requests": {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"},
                                       "limits": {"memory": "32Gi", "nvidia.com/gpu": "1"}},
                         "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                                            "periodSeconds": 5},
                         "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"},
                                           "periodSeconds": 10},
                         "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http"}}}}],
                     "terminationGracePeriodSeconds": 60}}


async def create_pods(kube: LocalKube, n: int, nodes: list[str], per_node: int) -> None:
    client = httpx.AsyncClient(base_url=kube.url, timeout=60,
                               verify=ssl.create_default_context(cafile=str(kube.ca_file)),
                               headers={"Authorization": f"Bearer {kube.admin_token}"})
    sem = asyncio.Semaphore(16)
    with Progress() as bar:
        task = bar.add_task(f"creating {n} pods", total=n)

        async def one(i: int) -> None:
            async with sem:
                r = await client.post(f"/api/v1/namespaces/{NS}/pods", json=pod_body(i, nodes[i // per_node]))
                if r.status_code not in (201, 409):
                    raise RuntimeError(f"pod {i}: HTTP {r.status_code} {r.text[:300]}")
                bar.advance(task)
        await asyncio.gather(*(one(i) for i in range(n)))
        wait = bar.add_task("fake kubelet: pods Running", total=n)
        while True:
            r = await client.get(f"/api/v1/namespaces/{NS}/pods",
                                 params={"fieldSelector": "status.phase=Running"})
            running = len(r.json()["items"])
            bar.update(wait, completed=running)
            if running >= n:
                break
            await asyncio.sleep(3)
    await client.aclose()


def apply(kube: LocalKube, path: str, body: dict[str, Any]) -> None:
    code, out = kube.request("POST", path, body)
    if code not in (201, 409):
        raise RuntimeError(f"POST {path}: HTTP {code} {out}")


def setup_cluster(kube: LocalKube, args: argparse.Namespace) -> None:
    for crd in sorted((ROOT / "charts" / "ttsfleet" / "crds").glob("*.yaml")):
        apply(kube, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
              yaml.safe_load(crd.read_text()))
    apply(kube, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    deadline = time.time() + 60
    while kube.request("GET", f"/api/v1/namespaces/{NS}/serviceaccounts/default")[0] != 200:
        if time.time() > deadline:
            raise RuntimeError("no default ServiceAccount")
        time.sleep(0.5)
    for plural in ("ttsdeployments", "filljobs"):  # CRDs established
        while kube.request("GET", f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/{plural}")[0] != 200:
            time.sleep(0.5)
    per_node = args.pods // args.nodes
    asyncio.run(create_pods(kube, args.pods, [f"gpu-{k:03d}" for k in range(args.nodes)], per_node))
    kube.procs["fake-kubelet"].terminate()  # the one we started: nothing moves while measuring
    kube.procs["fake-kubelet"].wait(30)
    apply(kube, f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/ttsdeployments", {
        "apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "voice"},
        "spec": {"model": {"checkpoint": "s3://m/v1"}, "image": "ghcr.io/ttsfleet/inference:test",
                 "pools": [{"gpuClass": "h200", "minReplicas": 0, "maxReplicas": 4}]}})
    apply(kube, f"/apis/ttsfleet.io/v1alpha1/namespaces/{NS}/filljobs", {
        "apiVersion": "ttsfleet.io/v1alpha1", "kind": "FillJob", "metadata": {"name": "clean"},
        "spec": {"image": "ghcr.io/ttsfleet/fill:test", "manifest": "/data/m.jsonl", "output": "/data/out",
                 "checkpointVolume": {"claimName": "ckpt", "mountPath": "/checkpoints"},
                 "shards": 16, "gpuClasses": ["h200"]}})


def list_size(kube: LocalKube) -> tuple[int, int]:
    """Bytes of one full pod LIST (what the old path fetched per pass) and the pod count."""
    ctx = ssl.create_default_context(cafile=str(kube.ca_file))
    with httpx.Client(base_url=kube.url, verify=ctx, timeout=120,
                      headers={"Authorization": f"Bearer {kube.admin_token}"}) as c:
        r = c.get("/api/v1/pods", params={"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"})
        return len(r.content), len(r.json()["items"])


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except FileNotFoundError:
        return None
    return None


def run_mode(kube: LocalKube, mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    result = work / f"{mode}.json"
    env = {**os.environ, "KUBECONFIG": str(kube.admin_kubeconfig)}
    proc = subprocess.Popen(
        [sys.executable, "-P", str(HERE / "run_operator.py"), "--mode", mode, "--kubeconfig",
         str(kube.admin_kubeconfig), "--duration", str(args.duration), "--result", str(result)],
        env=env, stdout=(work / f"{mode}.log").open("wb"), stderr=subprocess.STDOUT)
    samples, t0 = [], time.monotonic()
    with Progress() as bar:
        task = bar.add_task(f"operator ({mode}): measuring", total=args.duration)
        while proc.poll() is None:
            rss = rss_mib(proc.pid)
            if rss is not None:
                samples.append((round(time.monotonic() - t0, 1), rss))
            bar.update(task, completed=min(time.monotonic() - t0, args.duration))
            time.sleep(1.0)
    if proc.returncode != 0:
        log = (work / f"{mode}.log").read_text()[-2000:]
        raise RuntimeError(f"{mode} operator exited {proc.returncode}: {log}")
    out = json.loads(result.read_text())
    out["rss"] = samples
    return out


def summarize(run: dict[str, Any], warmup: float) -> dict[str, Any]:
    span = run["duration_s"] - warmup
    steady = [(t, v, r) for t, v, r in run["requests"] if t >= warmup]
    per_min = 60.0 / span
    count = {}
    for _, verb, res in steady:
        count[f"{verb} {res}"] = count.get(f"{verb} {res}", 0) + 1
    received = sum(b for s, b in run["bytes_per_s"] if s >= warmup)
    rss = [v for t, v in run["rss"] if t >= warmup]
    return {
        "mode": run["mode"], "baseline_rss_mib": round(run["baseline_rss_mib"], 1),
        "peak_rss_mib": round(max(v for _, v in run["rss"]), 1),
        "steady_rss_mib_median": round(statistics.median(rss), 1),
        "steady_rss_mib_min_max": [round(min(rss), 1), round(max(rss), 1)],
        "requests_per_min": {k: round(v * per_min, 1) for k, v in sorted(count.items())},
        "total_requests_per_min": round(len(steady) * per_min, 1),
        "pod_node_lists_per_min": round(sum(v for k, v in count.items()
                                            if k in ("list pods", "list nodes")) * per_min, 1),
        "mib_received_per_min_wire": round(received / 2**20 * per_min, 2),  # gzip-compressed
        "startup_lists": sum(1 for t, v, r in run["requests"] if t < warmup and v == "list"),
        "gpus_total_metric": run["gpus_total_metric"], "cached_objects": run["cached_objects"],
    }


#: Table column -> summary key (each a number per run).
COLUMNS = {"RSS baseline MiB": "baseline_rss_mib", "RSS peak MiB": "peak_rss_mib",
           "RSS steady median MiB": "steady_rss_mib_median",
           "pod/node LIST/min": "pod_node_lists_per_min", "requests/min": "total_requests_per_min",
           "MiB received/min (wire, gzip)": "mib_received_per_min_wire"}


def plot(runs: dict[str, list[dict[str, Any]]], summary: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    colors = {"list": "tab:orange", "watch": "tab:blue"}
    for mode, mode_runs in runs.items():
        for k, run in enumerate(mode_runs):
            ts, vs = zip(*run["rss"], strict=True)
            med = summary[mode]["runs"][k]["steady_rss_mib_median"]
            ax.plot(ts, vs, color=colors[mode], alpha=1.0 if k == 0 else 0.5,
                    label=f"{mode} run {k + 1} (steady median {med:g} MiB)")
    ax.axhline(LIMIT_MIB, color="red", linestyle="--", label="chart limit 512Mi")
    ax.set_xlabel("seconds since operator start")
    ax.set_ylabel("RSS (MiB, /proc VmRSS)")
    ax.set_title(f"ttsfleet operator at {summary['pods']} pods: LIST every pass vs watch caches")
    top = max(v for rs in runs.values() for r in rs for _, v in r["rss"])
    ax.set_ylim(0, max(LIMIT_MIB, top) * 1.1)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--duration", type=float, default=150.0, help="seconds each operator runs")
    ap.add_argument("--warmup", type=float, default=30.0, help="start-up seconds left out of the rates")
    ap.add_argument("--repeats", type=int, default=2, help="runs per mode, alternating")
    ap.add_argument("--modes", default="list,watch", help="comma-separated: list, watch")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    if missing_binaries():
        print(f"local control plane not built: scripts/kube-local.sh build ({', '.join(missing_binaries())})")
        return 2
    per_node = -(-args.pods // args.nodes)
    nodes = [FakeNode(f"gpu-{k:03d}", {"ttsfleet.io/gpu-class": "h200"}, gpus=per_node)
             for k in range(args.nodes)]
    work = Path(tempfile.mkdtemp(prefix="ttsfleet-bench-operator-"))
    kube = LocalKube(work / "kube", nodes)
    console = Console(width=150)
    try:
        kube.start()
        setup_cluster(kube, args)
        list_bytes, listed = list_size(kube)
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes.split(",")}
        for _ in range(args.repeats):  # alternating, so drift on the machine hits both alike
            for mode in runs:
                runs[mode].append(run_mode(kube, mode, args, work))
    finally:
        kube.stop()
    summary: dict[str, Any] = {
        "date": dt.date.today().isoformat(), "machine": {
            "nproc": os.cpu_count(),
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
            "cpu": platform.processor() or platform.machine(), "python": platform.python_version()},
        "pods": listed, "nodes": args.nodes, "one_pod_list_mib": round(list_bytes / 2**20, 2),
        "duration_s": args.duration, "warmup_s": args.warmup, "chart_limit_mib": LIMIT_MIB}
    for mode, mode_runs in runs.items():
        per_run = [summarize(r, args.warmup) for r in mode_runs]
        summary[mode] = {"runs": per_run, "median": {
            k: statistics.median(r[k] for r in per_run) for k in COLUMNS.values()}}
    table = Table(title=f"operator at {listed} pods ({args.nodes} nodes; one pod LIST = "
                        f"{summary['one_pod_list_mib']} MiB of JSON decoded); median (min-max) "
                        f"of {args.repeats} run(s)")
    table.add_column("mode")
    for col in COLUMNS:
        table.add_column(col, justify="right")
    for mode in runs:
        cells = []
        for key in COLUMNS.values():
            vals = [r[key] for r in summary[mode]["runs"]]
            cells.append(f"{statistics.median(vals):g} ({min(vals):g}-{max(vals):g})")
        table.add_row(mode, *cells)
    console.print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = summary["date"]
    (args.out / f"results-{stamp}.json").write_text(json.dumps(
        {"summary": summary, "rss": {m: [r["rss"] for r in rs] for m, rs in runs.items()}}, indent=1))
    plot(runs, summary, args.out / "watch-memory.png")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

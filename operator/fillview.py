"""Pure functions for the fill controller: cluster objects → policy observations, spec → fill pods.

The controller lists nodes and pods; :func:`observe` turns them into one
:class:`ttsfleet.policy.ClassObservation` per GPU class (GPUs held by inference, training and fill,
pending demand, fill pods with their un-checkpointed work), :func:`fill_pod` builds a shard's pod,
and :func:`account` turns this job's finished or vanished pods into shard progress. The decisions
themselves come from :func:`ttsfleet.policy.plan_fill`.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ttsfleet.operator.desired import (
    CONTAINER_SECURITY,
    L_MANAGED_BY,
    L_WORKLOAD,
    MANAGED_BY,
    POD_SECURITY,
    TMP_MOUNT,
    TMP_VOLUME,
    kernel_cache,
)
from ttsfleet.operator.models import GPU_CLASS_LABEL, FillJobSpec

from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts import fill as contract
from ttsfleet.contracts import serving
from ttsfleet.contracts.exits import PREEMPTED_REQUEUE
from ttsfleet.policy import ClassObservation, FillJobView

FILL_PRIORITY_CLASS = "ttsfleet-fill"
TRAINING_PRIORITY_CLASS = "ttsfleet-training"
L_FILLJOB = "ttsfleet.io/filljob"
L_SHARD = "ttsfleet.io/shard"
GPU = "nvidia.com/gpu"


def parse_time(ts: str | None) -> float | None:
    """Unix seconds of a Kubernetes timestamp (RFC 3339; naive ones are UTC); None if unparsable."""
    if not ts:
        return None
    try:
        dt = datetime.datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=datetime.UTC)
    return dt.timestamp()


def pod_gpus(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        val = (res.get("limits") or {}).get(GPU) or (res.get("requests") or {}).get(GPU) or 0
        total += int(val)
    return total


#: Server-side selectors for the cluster-wide GPU picture: only nodes with a class label, only
#: pods that may hold a GPU (finished pods hold none).
NODE_SELECTOR = GPU_CLASS_LABEL
UNFINISHED = "status.phase!=Succeeded,status.phase!=Failed"


#: Seconds past a fill pod's deletion deadline after which a pod on a lost node is given up.
STUCK_AFTER_S = 30.0


def node_ready(node: Mapping[str, Any]) -> bool:
    ready = [c for c in (node.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"]
    return bool(ready) and ready[0].get("status") == "True"


def stuck_on_lost_node(pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]], now_wall: float) -> bool:
    """Terminating past its deadline (+ :data:`STUCK_AFTER_S`) on a node that is NotReady or gone:
    no kubelet will finish it, so its shard would be blocked for ever. (A pod whose kubelet is
    alive but slow is left alone: it still holds the GPU.)"""
    meta = pod.get("metadata") or {}
    deadline = parse_time(meta.get("deletionTimestamp"))
    if deadline is None or now_wall < deadline + STUCK_AFTER_S:
        return False
    name = (pod.get("spec") or {}).get("nodeName")
    node = next((n for n in nodes if (n.get("metadata") or {}).get("name") == name), None)
    return node is None or not node_ready(node)


def pod_id(pod: Mapping[str, Any]) -> str:
    """``namespace/name``: how the policy and the busy map name a pod."""
    meta = pod["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _class_name(node_label: str | None, catalog: GpuCatalog) -> str | None:
    cls = catalog.class_for_node_label(node_label)
    return cls.name if cls is not None else None


def wanted_class(pod: Mapping[str, Any], catalog: GpuCatalog) -> str | None:
    """The GPU class a pod is pinned to: the catalog's class for the node label value in its node
    selector or required node affinity, else the pod's own class label."""
    spec = pod.get("spec") or {}
    if value := (spec.get("nodeSelector") or {}).get(GPU_CLASS_LABEL):
        return _class_name(value, catalog)
    aff = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
           .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    for term in aff.get("nodeSelectorTerms") or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == GPU_CLASS_LABEL and expr.get("operator") == "In" and expr.get("values"):
                return _class_name(expr["values"][0], catalog)
    return ((pod.get("metadata") or {}).get("labels") or {}).get(GPU_CLASS_LABEL)


def workload(pod: Mapping[str, Any]) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if labels.get(L_WORKLOAD) == "fill":
        return "fill"
    if labels.get(L_WORKLOAD) == "training" or \
            (pod.get("spec") or {}).get("priorityClassName") == TRAINING_PRIORITY_CLASS:
        return "training"
    return "inference"


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The fill container's ``state.terminated`` (empty while it runs)."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if term := (cs.get("state") or {}).get("terminated"):
            return term
    return {}


def pod_shard_state(pod: Mapping[str, Any]) -> contract.ShardState | None:
    """The shard state the fill job left in its termination message (its last checkpoint, handed
    over by the kubelet however the container ended); None without one."""
    return contract.parse_shard_state(terminated(pod).get("message"))


def seconds_since_checkpoint(pod: Mapping[str, Any], now_wall: float, interval_s: float) -> float:
    """Work at risk (:func:`ttsfleet.contracts.fill.work_at_risk`) of a fill pod: until it ended,
    since the later of its start and the last checkpoint its termination message names; without
    one, estimated from its start time."""
    term = terminated(pod)
    started = parse_time(term.get("startedAt") or (pod.get("status") or {}).get("startTime"))
    end = parse_time(term.get("finishedAt")) if term else None
    state = pod_shard_state(pod)
    return contract.work_at_risk(end if end is not None else now_wall, started,
                                 state.last_checkpoint_at if state else None, interval_s)


@dataclass
class Inventory:
    """GPUs per class from the nodes: total and unavailable (cordoned or not Ready)."""

    total: dict[str, int] = field(default_factory=dict)
    unavailable: dict[str, int] = field(default_factory=dict)
    node_class: dict[str, str] = field(default_factory=dict)


def inventory(nodes: Iterable[Mapping[str, Any]], catalog: GpuCatalog) -> Inventory:
    """GPUs per class, a node's class being the catalog's class for its node label value."""
    inv = Inventory()
    for node in nodes:
        meta = node.get("metadata") or {}
        found = catalog.class_of_node(meta.get("labels"))
        if found is None:
            continue
        cls = found.name
        status = node.get("status") or {}
        gpus = int((status.get("allocatable") or status.get("capacity") or {}).get(GPU, 0))
        inv.node_class[meta["name"]] = cls
        inv.total[cls] = inv.total.get(cls, 0) + gpus
        ready = [c for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        down = (node.get("spec") or {}).get("unschedulable") or (ready and ready[0].get("status") != "True")
        if down:
            inv.unavailable[cls] = inv.unavailable.get(cls, 0) + gpus
    return inv


def observe(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], t: float,
            now_wall: float, checkpoint_interval_s: float, catalog: GpuCatalog,
            forecasts: Mapping[str, float | None] | None = None,
            checkpoint_ages: Mapping[str, float] | None = None) -> dict[str, ClassObservation]:
    """One observation per GPU class that has nodes. ``checkpoint_ages`` (``ns/name`` → seconds, as
    the fill pods report it) wins over the annotation/start-time estimate."""
    inv = inventory(nodes, catalog)
    acc: dict[str, dict[str, Any]] = {c: {"inference": 0, "training": 0, "p_inference": 0,
                                          "p_training": 0, "fill": []} for c in inv.total}
    for pod in pods:
        if finished(pod):
            continue
        gpus = pod_gpus(pod)
        if gpus == 0:
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        cls = inv.node_class.get(node) if node else wanted_class(pod, catalog)
        if cls not in acc:
            continue
        kind = workload(pod)
        meta = pod["metadata"]
        if kind == "fill":
            # Ours: counted as holding its GPUs from creation, so admission never overshoots.
            pid = f"{meta.get('namespace', '')}/{meta['name']}"
            age = (checkpoint_ages or {}).get(pid)
            if age is None:
                age = seconds_since_checkpoint(pod, now_wall, checkpoint_interval_s)
            acc[cls]["fill"].append(FillJobView(id=pid, gpus=gpus, seconds_since_checkpoint=age,
                                                terminating=bool(meta.get("deletionTimestamp"))))
        elif node:
            acc[cls][kind] += gpus
        else:
            acc[cls]["p_" + kind] += gpus
    out = {}
    for cls, a in acc.items():
        out[cls] = ClassObservation(
            gpu_class=cls, t=t, total_gpus=inv.total[cls], inference_gpus=a["inference"],
            training_gpus=a["training"], pending_inference_gpus=a["p_inference"],
            pending_training_gpus=a["p_training"], unavailable_gpus=inv.unavailable.get(cls, 0),
            fill_jobs=tuple(sorted(a["fill"], key=lambda j: j.id)),
            inference_forecast_gpus=(forecasts or {}).get(cls))
    return out


# --- the job's own pods ---------------------------------------------------------------------------


def own_pods(pods: Iterable[Mapping[str, Any]], namespace: str, job: str) -> list[Mapping[str, Any]]:
    return [p for p in pods
            if p["metadata"].get("namespace") == namespace
            and (p["metadata"].get("labels") or {}).get(L_FILLJOB) == job]


def shard_of(pod: Mapping[str, Any]) -> int:
    return int(pod["metadata"]["labels"][L_SHARD])


def exit_code(pod: Mapping[str, Any]) -> int | None:
    code = terminated(pod).get("exitCode")
    return int(code) if code is not None else None


def format_ranges(items: Iterable[int]) -> str:
    xs = sorted(set(items))
    out, i = [], 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        out.append(str(xs[i]) if i == j else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(out)


def parse_ranges(text: str) -> set[int]:
    out: set[int] = set()
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


@dataclass
class Accounting:
    """This job's progress after looking at its pods once."""

    done: set[int]
    failed: set[int]
    failures: dict[str, int]
    preemptions: int
    lost_work_s: float
    active: list[str]  # not finished, not gone
    accounted: list[str]  # finished and counted: deleted next pass
    to_delete: list[str]  # finished pods counted in an earlier pass
    running_shards: set[int]


def account(status: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], spec: FillJobSpec,
            now_wall: float) -> Accounting:
    """Fold this job's pods into its status: exit 0 = shard done, 99 = preempted (requeue),
    anything else = a failure that may have lost the work since the last checkpoint."""
    done = parse_ranges(status.get("completedShards", ""))
    failed = parse_ranges(status.get("failedShards", ""))
    failures = {str(k): int(v) for k, v in (status.get("shardFailures") or {}).items()}
    preemptions = int(status.get("preemptionsSurvived", 0))
    lost = float(status.get("lostWorkSeconds", 0.0))
    previously_active = set(status.get("activePods") or [])
    previously_accounted = set(status.get("accountedPods") or [])
    names = {p["metadata"]["name"] for p in pods}
    active, accounted, to_delete, running = [], [], [], set()
    for pod in pods:
        name = pod["metadata"]["name"]
        shard = shard_of(pod)
        if not finished(pod):
            active.append(name)
            running.add(shard)
            continue
        if name in previously_accounted:
            to_delete.append(name)
            continue
        accounted.append(name)
        code = exit_code(pod)
        phase = pod["status"]["phase"]
        state = pod_shard_state(pod)
        if phase == "Succeeded" or code == 0 or (state is not None and state.complete):
            done.add(shard)
        elif code == PREEMPTED_REQUEUE:
            preemptions += 1
        else:
            failures[str(shard)] = failures.get(str(shard), 0) + 1
            lost += seconds_since_checkpoint(pod, now_wall, spec.policy.checkpoint_interval_s)
            if failures[str(shard)] > spec.max_failures_per_shard:
                failed.add(shard)
    # Pods that vanished while running (evicted, preempted by the scheduler, node lost) resume
    # from their checkpoint: a preemption survived.
    preemptions += sum(1 for n in previously_active if n not in names)
    running -= done
    return Accounting(done, failed - done, failures, preemptions, lost, sorted(active), sorted(accounted),
                      sorted(to_delete), running)


def next_shards(spec: FillJobSpec, acc: Accounting, count: int) -> list[int]:
    busy = acc.done | acc.failed | acc.running_shards
    return [s for s in range(spec.shards) if s not in busy][:count]


def pod_name(job: str, shard: int, existing: set[str]) -> str:
    """Deterministic: the same view of the cluster always yields the same name (no duplicates)."""
    n = 0
    while f"{job}-{shard}-{n}" in existing:
        n += 1
    return f"{job}-{shard}-{n}"


def checkpoint_dir(spec: FillJobSpec, job: str) -> str:
    """The FillJob's ``--checkpoint`` directory on its volume; every shard keeps its file there
    (:func:`ttsfleet.contracts.fill.checkpoint_file`)."""
    return f"{spec.checkpoint_volume.mount_path.rstrip('/')}/{job}"


def fill_args(job: str, spec: FillJobSpec, shard: int) -> list[str]:
    """The shard's ``fill run`` arguments, from the contract's builder."""
    return contract.fill_argv(manifest=spec.manifest, output=spec.output,
                              checkpoint=checkpoint_dir(spec, job), shard=f"{shard}/{spec.shards}",
                              stages=",".join(spec.stages) if spec.stages else None,
                              checkpoint_every_s=spec.policy.checkpoint_interval_s)


def fill_pod(job: str, namespace: str, spec: FillJobSpec, shard: int, gpu_class: str,
             name: str, catalog: GpuCatalog) -> dict[str, Any]:
    """The pod for one shard on one GPU class: lowest priority, never preempts, checkpoints on
    SIGTERM; placed by the class's catalog node label, like the inference pods."""
    volumes = [{"name": "checkpoint",
                "persistentVolumeClaim": {"claimName": spec.checkpoint_volume.claim_name}}]
    mounts = [{"name": "checkpoint", "mountPath": spec.checkpoint_volume.mount_path}]
    if spec.data_volume is not None:
        volumes.append({"name": "data", "persistentVolumeClaim": {"claimName": spec.data_volume.claim_name}})
        mounts.append({"name": "data", "mountPath": spec.data_volume.mount_path})
    cache = kernel_cache(spec.kernel_cache)
    volumes += cache.volumes
    mounts += cache.mounts
    gpus = str(spec.gpus_per_pod)
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.model_dump(by_alias=True, exclude_defaults=True) for t in spec.tolerations]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {L_WORKLOAD: "fill", L_FILLJOB: job, L_SHARD: str(shard), GPU_CLASS_LABEL: gpu_class,
                       L_MANAGED_BY: MANAGED_BY, "app.kubernetes.io/name": "ttsfleet-fill"},
        },
        "spec": {
            "priorityClassName": FILL_PRIORITY_CLASS,
            "preemptionPolicy": "Never",
            "securityContext": dict(POD_SECURITY),
            # The operator requeues: exit 0 = shard done, 99 = checkpointed and preempted (retry,
            # not failure), anything else counts against maxFailuresPerShard.
            "restartPolicy": "Never",
            # Whole seconds, at least 1: 0 would make every eviction a force delete.
            "terminationGracePeriodSeconds": max(math.ceil(spec.policy.grace_period_s), 1),
            "nodeSelector": {**spec.node_selector, **catalog.get(gpu_class).node_selector()},
            "tolerations": tolerations,
            "containers": [{
                "name": "fill",
                "image": spec.image,
                "command": list(spec.command),
                "args": fill_args(job, spec, shard),
                "ports": [{"name": "metrics", "containerPort": contract.METRICS_PORT, "protocol": "TCP"}],
                "env": [{"name": serving.GPU_CLASS, "value": gpu_class},
                        {"name": contract.JOB_ENV, "value": f"{job}-{shard}"},
                        {"name": contract.METRICS_PORT_ENV, "value": str(contract.METRICS_PORT)},
                        # the last checkpoint reaches the operator in the pod status, however it ends
                        {"name": contract.STATE_FILE_ENV, "value": contract.TERMINATION_LOG},
                        *cache.env],
                "terminationMessagePath": contract.TERMINATION_LOG,
                "terminationMessagePolicy": "File",
                "resources": {"requests": {"cpu": spec.resources.cpu, "memory": spec.resources.memory,
                                           GPU: gpus},
                              "limits": {"memory": spec.resources.memory, GPU: gpus}},
                "volumeMounts": [*mounts, dict(TMP_MOUNT)],
                "securityContext": dict(CONTAINER_SECURITY),
            }],
            "volumes": [*volumes, dict(TMP_VOLUME)],
        },
    }

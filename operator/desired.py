"""Spec → desired objects for a TTSDeployment: the run's catalog as a ConfigMap, per pool a
Deployment, a Service, a PDB and, with ``spec.networkPolicy``, a NetworkPolicy (who may call the
pool: :mod:`ttsfleet.operator.access`).

Pure functions, no I/O: the handlers adopt the returned dicts (owner references) and reconcile them
by diff (:mod:`ttsfleet.operator.reconcile`). Serving settings per GPU class come from
:mod:`ttsfleet.catalog`; what a server pod is handed (its ``TTSFLEET_*`` variables and the run's
catalog file) is the serving door, :mod:`ttsfleet.contracts.serving`. Nothing here decides
replicas (the autoscaler owns ``spec.replicas``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from ttsfleet.operator import access
from ttsfleet.operator.models import GPU_CLASS_LABEL, KernelCache, TTSDeploymentSpec, TTSPool

from ttsfleet.catalog import GpuCatalog
from ttsfleet.contracts import serving as contract
from ttsfleet.policy import clamp_replicas
from ttsfleet.quantization import AUTO, BF16, QuantScheme

INFERENCE_PORT = contract.INFERENCE_PORT
INFERENCE_PRIORITY_CLASS = "ttsfleet-inference"
MODEL_MOUNT = "/models"

L_NAME = "app.kubernetes.io/name"
L_INSTANCE = "app.kubernetes.io/instance"
L_COMPONENT = "app.kubernetes.io/component"
L_MANAGED_BY = "app.kubernetes.io/managed-by"
L_DEPLOYMENT = "ttsfleet.io/deployment"
L_POOL = "ttsfleet.io/pool"
L_WORKLOAD = "ttsfleet.io/workload"
MANAGED_BY = "ttsfleet-operator"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
#: The catalog text's digest on the pod template: a new catalog rolls the pods that read it.
A_CATALOG_DIGEST = "ttsfleet.io/catalog-sha256"
CATALOG_VOLUME = "catalog"



def child_name(deployment: str, pool: TTSPool) -> str:
    return f"{deployment}-{pool.key}"


def pool_labels(deployment: str, pool: TTSPool) -> dict[str, str]:
    """Labels on every object of one pool; the first two form the selector."""
    return {
        L_INSTANCE: deployment,
        L_POOL: pool.key,
        L_NAME: "ttsfleet-inference",
        L_COMPONENT: "inference",
        L_MANAGED_BY: MANAGED_BY,
        L_DEPLOYMENT: deployment,
        GPU_CLASS_LABEL: pool.gpu_class,
        L_WORKLOAD: "inference",
    }


def selector(deployment: str, pool: TTSPool) -> dict[str, str]:
    return {L_INSTANCE: deployment, L_POOL: pool.key}


def quantization(spec: TTSDeploymentSpec, pool: TTSPool, catalog: GpuCatalog) -> QuantScheme:
    """``auto`` resolves to the class's scheme in the run's catalog."""
    if spec.quantization != AUTO:
        return spec.quantization  # type: ignore[return-value]
    return catalog.get(pool.gpu_class).quantization


def catalog_configmap_name(deployment: str) -> str:
    return f"{deployment}-catalog"


def catalog_configmap(name: str, catalog: GpuCatalog) -> dict[str, Any]:
    """The run's catalog as a file for the server pods (the serving door's catalog hand-off)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": catalog_configmap_name(name),
                     "labels": {L_INSTANCE: name, L_NAME: "ttsfleet-inference", L_COMPONENT: "catalog",
                                L_MANAGED_BY: MANAGED_BY, L_DEPLOYMENT: name}},
        "data": {contract.CATALOG_KEY: catalog.to_yaml()},
    }


def catalog_digest(catalog: GpuCatalog) -> str:
    return hashlib.sha256(catalog.to_yaml().encode()).hexdigest()[:16]


def serving_env(spec: TTSDeploymentSpec, pool: TTSPool, catalog: GpuCatalog,
                model_name: str = "") -> list[dict[str, str]]:
    pvc = spec.model.pvc
    checkpoint = f"{MODEL_MOUNT}/{pvc[1]}".rstrip("/") if pvc else spec.model.checkpoint
    quant = quantization(spec, pool, catalog)
    env = [
        # The server binds 127.0.0.1 unless told: in a pod it must listen on the pod's IP.
        {"name": contract.HOST, "value": "0.0.0.0"},
        {"name": contract.PORT, "value": str(INFERENCE_PORT)},
        {"name": contract.GPU_CLASS, "value": pool.gpu_class},
        {"name": contract.MAX_RUNNING_REQUESTS,
         "value": str(spec.max_running_requests(pool.gpu_class, catalog))},
        {"name": contract.CUDA_GRAPH_MAX_BS, "value": str(spec.cuda_graph_max_bs(pool.gpu_class, catalog))},
        # "none": the vocabulary's input alias of bf16, which every server version reads.
        {"name": contract.QUANTIZATION, "value": "none" if quant == BF16 else quant},
        {"name": contract.CHECKPOINT, "value": checkpoint},
        {"name": contract.MODEL_NAME, "value": model_name},
        # The run's catalog, mounted from its ConfigMap: a class added by a catalog file is known.
        {"name": contract.CATALOG, "value": contract.CATALOG_PATH},
        # Exit before the kubelet's SIGKILL even if a request is still streaming.
        {"name": contract.DRAIN_TIMEOUT_S,
         "value": str(max(spec.serving.termination_grace_seconds - 5, 1))},
        *kernel_cache(spec.serving.kernel_cache).env,
    ]
    keys = access.api_key_env(spec.api_key_secret)  # from the Secret: it wins over spec.env
    ours = {e["name"] for e in env + keys}
    env += [{"name": e.name, "value": e.value} for e in spec.env if e.name not in ours]
    # The API server drops empty values (omitempty); a desired "" would never match the live object.
    return [e if e["value"] else {"name": e["name"]} for e in env] + keys


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "failureThreshold": failures, "timeoutSeconds": 2}


#: Every pod the operator creates runs like the chart's own: non-root (the images' UID 10001),
#: group-writable volumes (fsGroup, so checkpoint PVCs are writable), read-only root filesystem
#: with a writable /tmp (torch/triton caches), no privilege escalation, no capabilities.
RUN_AS = 10001
POD_SECURITY: dict[str, Any] = {"runAsNonRoot": True, "runAsUser": RUN_AS, "runAsGroup": RUN_AS,
                                "fsGroup": RUN_AS, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY: dict[str, Any] = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                      "capabilities": {"drop": ["ALL"]}}
TMP_VOLUME: dict[str, Any] = {"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}
TMP_MOUNT: dict[str, Any] = {"name": "tmp", "mountPath": "/tmp"}
#: Where Triton and Inductor keep compiled kernels in a pod (their own variables). Our images set
#: ``HOME=/tmp`` and ``TRITON_CACHE_DIR=/tmp/triton`` (``docker/inference.Dockerfile``); the pod says
#: so itself because ``spec.image`` may be any image, where Triton's default ``$HOME/.triton`` can
#: lie on the read-only root, and so that ``serving.kernelCache`` can move both to its volume.
KERNEL_CACHE_ENV = {"TRITON_CACHE_DIR": "triton", "TORCHINDUCTOR_CACHE_DIR": "torchinductor"}
KERNEL_CACHE_VOLUME = "kernel-cache"
KERNEL_CACHE_MOUNT = "/var/cache/ttsfleet"


@dataclass(frozen=True)
class KernelCachePlumbing:
    """What a pod needs for its compiled-kernel caches: the two variables and, with a
    :class:`~ttsfleet.operator.models.KernelCache`, its volume and mount."""

    env: list[dict[str, str]]
    volumes: list[dict[str, Any]]
    mounts: list[dict[str, Any]]


def kernel_cache(cache: KernelCache | None) -> KernelCachePlumbing:
    """The caches under the pod's /tmp, or under ``cache``'s volume mounted at :data:`KERNEL_CACHE_MOUNT`."""
    root = KERNEL_CACHE_MOUNT if cache else "/tmp"
    env = [{"name": name, "value": f"{root}/{sub}"} for name, sub in KERNEL_CACHE_ENV.items()]
    if cache is None:
        return KernelCachePlumbing(env, [], [])
    source = ({"persistentVolumeClaim": {"claimName": cache.claim_name}} if cache.claim_name
              else {"hostPath": {"path": cache.host_path, "type": "Directory"}})
    return KernelCachePlumbing(env, [{"name": KERNEL_CACHE_VOLUME, **source}],
                               [{"name": KERNEL_CACHE_VOLUME, "mountPath": KERNEL_CACHE_MOUNT}])


def pod_template(name: str, spec: TTSDeploymentSpec, pool: TTSPool,
                 catalog: GpuCatalog) -> dict[str, Any]:
    res = spec.resources
    gpus = str(res.gpus)
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
                                     dict(TMP_VOLUME),
                                     {"name": CATALOG_VOLUME,
                                      "configMap": {"name": catalog_configmap_name(name)}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}, dict(TMP_MOUNT),
                                    {"name": CATALOG_VOLUME, "mountPath": contract.CATALOG_DIR,
                                     "readOnly": True}]
    cache = kernel_cache(spec.serving.kernel_cache)
    volumes += cache.volumes
    mounts += cache.mounts
    pvc = spec.model.pvc
    if pvc:
        volumes.append({"name": "model", "persistentVolumeClaim": {"claimName": pvc[0], "readOnly": True}})
        mounts.append({"name": "model", "mountPath": MODEL_MOUNT, "readOnly": True})
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    tolerations += [t.model_dump(by_alias=True, exclude_defaults=True) for t in spec.tolerations]
    serving = spec.serving
    container = {
        "name": "server",
        "image": spec.image,
        "command": ["ttsfleet", "serve"],
        "ports": [{"name": "http", "containerPort": INFERENCE_PORT, "protocol": "TCP"}],
        "env": serving_env(spec, pool, catalog, model_name=name),
        "resources": {
            "requests": {"cpu": res.cpu, "memory": res.memory, "nvidia.com/gpu": gpus},
            "limits": {"memory": res.memory, "nvidia.com/gpu": gpus},
        },
        "startupProbe": _probe("/healthz", 10, max(serving.startup_seconds // 10, 1)),
        "livenessProbe": _probe("/healthz", 10, 3),
        "readinessProbe": _probe("/readyz", 5, 2),
        # The endpoint leaves the Service first, then SIGTERM lets in-flight requests finish.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(serving.drain_seconds)]}}},
        "volumeMounts": mounts,
        "securityContext": dict(CONTAINER_SECURITY),
    }
    return {
        "metadata": {
            "labels": pool_labels(name, pool),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(INFERENCE_PORT),
                            "prometheus.io/path": "/metrics", A_CATALOG_DIGEST: catalog_digest(catalog)},
        },
        "spec": {
            "priorityClassName": INFERENCE_PRIORITY_CLASS,
            "securityContext": dict(POD_SECURITY),
            "terminationGracePeriodSeconds": serving.drain_seconds + serving.termination_grace_seconds,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": key, "operator": "In", "values": [value]}
                    for key, value in catalog.get(pool.gpu_class).node_selector().items()]}]}}},
            "tolerations": tolerations,
            "containers": [container],
            "volumes": volumes,
            # Only when set: the API server drops an empty map, so `{}` would be drift for ever.
            **({"nodeSelector": dict(spec.node_selector)} if spec.node_selector else {}),
        },
    }


def deployment(name: str, spec: TTSDeploymentSpec, pool: TTSPool, catalog: GpuCatalog,
               replicas: int) -> dict[str, Any]:
    """The pool's Deployment; ``replicas`` is only used when it is created."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": child_name(name, pool), "labels": pool_labels(name, pool)},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector(name, pool)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "progressDeadlineSeconds": spec.serving.startup_seconds + 300,
            "template": pod_template(name, spec, pool, catalog),
        },
    }


def service(name: str, pool: TTSPool | None) -> dict[str, Any]:
    """The pool's Service, or (``pool=None``) the deployment-wide one spanning every pool."""
    if pool is None:
        labels = {L_INSTANCE: name, L_NAME: "ttsfleet-inference", L_MANAGED_BY: MANAGED_BY,
                  L_DEPLOYMENT: name}
        sel = {L_INSTANCE: name, L_WORKLOAD: "inference"}
        svc_name = name
    else:
        labels, sel, svc_name = pool_labels(name, pool), selector(name, pool), child_name(name, pool)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": svc_name, "labels": labels},
        "spec": {"type": "ClusterIP", "selector": sel,
                 "ports": [{"name": "http", "port": INFERENCE_PORT, "targetPort": "http",
                            "protocol": "TCP"}]},
    }


def pdb(name: str, pool: TTSPool) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": child_name(name, pool), "labels": pool_labels(name, pool)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector(name, pool)}},
    }


def initial_replicas(pool: TTSPool) -> int:
    return clamp_replicas(pool, 0)


def desired_objects(name: str, spec: TTSDeploymentSpec, catalog: GpuCatalog) -> list[dict[str, Any]]:
    """Every child object of a TTSDeployment, in creation order (the catalog before the pods
    that mount it)."""
    objs: list[dict[str, Any]] = [catalog_configmap(name, catalog)]
    for pool in spec.pools:
        objs.append(deployment(name, spec, pool, catalog, initial_replicas(pool)))
        objs.append(service(name, pool))
        objs.append(pdb(name, pool))
        if spec.network_policy is not None:
            objs.append(access.network_policy(child_name(name, pool), pool_labels(name, pool),
                                              selector(name, pool), INFERENCE_PORT, spec.network_policy))
    objs.append(service(name, None))
    return objs


def name_problems(name: str, spec: TTSDeploymentSpec) -> list[str]:
    """Child names must be DNS labels (Services): at most 63 characters."""
    return [f"child name {child_name(name, p)!r} is longer than 63 characters"
            for p in spec.pools if len(child_name(name, p)) > 63]

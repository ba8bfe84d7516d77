"""The custom resources' spec and status as pydantic models: the single source of the CRD schemas.

``ttsfleet operator crds`` renders the apiextensions/v1 schemas from these classes, and the handlers
validate every incoming object with the very same classes, so the schema the API server enforces
and the checks the operator runs cannot drift apart. The serving, autoscaling and fill knobs are the
core's own :mod:`ttsfleet.config` models, embedded unchanged (the pool model only narrows the GPU
class to the catalog's names so the schema can reject unknown classes).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from ttsfleet.fill_jobs import registry
from ttsfleet.operator import quantity

from ttsfleet.catalog import NODE_LABEL_KEY, GpuCatalog, cuda_graph_max_bs
from ttsfleet.config import AutoscaleConfig, FillPolicyConfig, PoolSpec, WireModel
from ttsfleet.quantization import QuantRequestField

GROUP = "ttsfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
#: The pod and node label that names a GPU class (the catalog's, defined there once).
GPU_CLASS_LABEL = NODE_LABEL_KEY

#: A GPU class of the run's catalog: checked against ``context={"catalog": ...}`` when validating
#: (the built-in catalog without one); the CRD schema's enum is generated from the same catalog
#: (``ttsfleet operator crds --catalog FILE``), so a new class is one catalog file.
GpuClassName = str


def catalog_of(info: ValidationInfo | None) -> GpuCatalog:
    """The run's catalog from the validation context. Missing is a bug, not the built-in catalog:
    validate with ``context={"catalog": catalog}``."""
    found = ((info.context if info is not None else None) or {}).get("catalog")
    if not isinstance(found, GpuCatalog):
        raise TypeError("validating a GPU class needs the run's catalog: "
                        "model_validate(..., context={'catalog': catalog})")
    return found


def _known_classes(value: Any, info: ValidationInfo) -> Any:
    catalog = catalog_of(info)
    for name in [value] if isinstance(value, str) else value:
        if name not in catalog.classes:
            raise ValueError(f"unknown GPU class {name!r} (known: {catalog.names_text()})")
    return value

_QUANTITY = quantity.PATTERN
#: What the API server accepts as label keys (qualified names) and label values: checked here so a
#: spec the CRD admits never yields a child object the API server rejects.
LABEL_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
             r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
LABEL_VALUE = r"^$|^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
#: DNS-1035 label: what a Service name must be (TTSDeployment names prefix their Services').
DNS1035 = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_NODE_SELECTOR_RULES = {"x-kubernetes-validations": [
    {"rule": f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY}'))",
     "message": "nodeSelector keys must be label keys (prefix/name)"}],
    "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}, "maxProperties": 32}


#: The same label-map rules for NetworkPolicy peers' matchLabels.
_MATCH_LABELS_RULES = {**_NODE_SELECTOR_RULES, "x-kubernetes-validations": [
    {"rule": f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY}'))",
     "message": "matchLabels keys must be label keys (prefix/name)"}]}


def _check_node_selector(value: dict[str, str]) -> dict[str, str]:
    for k, v in value.items():
        if not re.match(LABEL_KEY, k) or len(v) > 63 or not re.match(LABEL_VALUE, v):
            raise ValueError(f"nodeSelector {k}={v!r} is not a valid label key/value")
    return value


def _check_optional_labels(value: dict[str, str] | None) -> dict[str, str] | None:
    return None if value is None else _check_node_selector(value)


class Toleration(WireModel):
    """A pod toleration (core/v1 Toleration), with the API server's own consistency rules."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(has(self.operator) && self.operator == 'Exists') || (has(self.key) && self.key != '')",
         "message": "a toleration without a key needs operator: Exists"},
        {"rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
         "message": "operator Exists takes no value"},
        {"rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
         "message": "tolerationSeconds needs effect: NoExecute"}]})

    key: str = Field(default="", max_length=317, pattern=r"^$|" + LABEL_KEY)
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str = Field(default="", max_length=63, pattern=LABEL_VALUE)
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    toleration_seconds: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator != "Exists" and not self.key:
            raise ValueError("a toleration without a key needs operator: Exists")
        if self.operator == "Exists" and self.value:
            raise ValueError("operator Exists takes no value")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError("tolerationSeconds needs effect: NoExecute")
        return self


class Resources(WireModel):
    """CPU and memory per pod (requests; memory is also the limit). GPUs are whole devices."""

    cpu: str = Field(default="4", pattern=_QUANTITY)
    memory: str = Field(default="32Gi", pattern=_QUANTITY)
    gpus: int = Field(default=1, ge=1, le=8, description="nvidia.com/gpu per pod")

    @field_validator("cpu", "memory")
    @classmethod
    def _canonical(cls, value: str) -> str:
        """The API server's spelling (0.5 -> 500m), so desired objects equal the stored ones."""
        return quantity.canonical(value)


class EnvVar(WireModel):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = ""


class ModelSource(WireModel):
    """Where the checkpoint lives: ``pvc://CLAIM/path`` (mounted read-only) or a URI/path."""

    checkpoint: str = Field(min_length=1, pattern=r"^(pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?|"
                                                    r"[a-z][a-z0-9+.-]*://.+|/.+|tiny)$",
                            description="pvc://CLAIM/sub/path, s3://..., hf://..., an absolute path, "
                                        "or tiny (the server's random-weight CPU model: tests, demo)")
    family: str = Field(default="ttsfleet-ar", min_length=1, description="model family")

    @property
    def pvc(self) -> tuple[str, str] | None:
        """(claim, path inside the claim) for ``pvc://`` checkpoints, else None."""
        if not self.checkpoint.startswith("pvc://"):
            return None
        rest = self.checkpoint.removeprefix("pvc://")
        claim, _, path = rest.partition("/")
        return claim, path


class KernelCache(WireModel):
    """Where compiled GPU kernels persist across pod restarts (inference servers, fill shards): Triton's
    JIT cache (the decode, prefill and codec kernels) and Inductor's (``--codec-compile``). Without one
    each new pod compiles them again into its own ``/tmp``: on an H100 (2026-12-06, call 1) the first
    server on a fresh machine captured its decode graphs in 25.1 s and was ready after 67 s, the next
    two, with Triton's cache (and the machine's other caches) warm, in 4.4-4.7 s and 57-59 s. One of a
    PersistentVolumeClaim (ReadWriteMany where pods of several nodes share it) or a node directory
    (hostPath: it must exist and be writable by the pods' UID 10001 — fsGroup does not reach
    hostPath volumes — and the namespace must admit hostPath volumes, which the restricted Pod
    Security level does not). Entries are keyed by the kernel's source, options and GPU, so GPU
    classes and versions can share one cache."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.claimName) != has(self.hostPath)",
         "message": "kernelCache takes exactly one of claimName and hostPath"}]})

    claim_name: str | None = Field(default=None, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
                                   description="a PersistentVolumeClaim mounted read-write")
    host_path: str | None = Field(default=None, pattern=r"^/.+",
                                  description="an existing node directory writable by UID 10001")

    @model_validator(mode="after")
    def _exactly_one(self) -> KernelCache:
        if (self.claim_name is None) == (self.host_path is None):
            raise ValueError("kernelCache takes exactly one of claimName and hostPath")
        return self


class ServingSpec(WireModel):
    """Serving knobs; unset ones come from the GPU class in the catalog."""

    max_running_requests: int | None = Field(default=None, ge=1, le=4096)
    cuda_graph_max_bs: int | None = Field(default=None, ge=1, le=512,
                                          description="default maxRunningRequests (every admitted batch)")
    drain_seconds: int = Field(default=20, ge=0, le=600,
                               description="preStop sleep so the endpoint leaves load balancers")
    termination_grace_seconds: int = Field(default=90, ge=1, le=3600,
                                           description="SIGTERM to SIGKILL: in-flight requests finish")
    startup_seconds: int = Field(default=600, ge=10, le=7200,
                                 description="how long weights + graph capture may take")
    kernel_cache: KernelCache | None = Field(
        default=None, description="where compiled GPU kernels persist across pod restarts (else each "
                                  "pod compiles them into its /tmp)")


class ApiKeySecret(WireModel):
    """A Secret in the TTSDeployment's namespace whose ``key`` holds the accepted API keys
    (comma-separated): the pods get it as ``TTSFLEET_API_KEYS`` (the kubelet reads the Secret, the
    operator never does). Probes and ``/metrics`` stay open without a key."""

    name: str = Field(min_length=1, max_length=253,
                      pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    key: str = Field(default="api-keys", min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")


class IngressPeer(WireModel):
    """Who may connect (a NetworkPolicy peer): pods of the namespaces with these labels, or pods
    with these labels (in the TTSDeployment's namespace unless namespaceSelector is set too)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "has(self.namespaceSelector) || has(self.podSelector)",
         "message": "a peer needs namespaceSelector, podSelector or both"}]})

    namespace_selector: dict[str, str] | None = Field(default=None, json_schema_extra=_MATCH_LABELS_RULES,
                                                      description="matchLabels of the namespaces")
    pod_selector: dict[str, str] | None = Field(default=None, json_schema_extra=_MATCH_LABELS_RULES,
                                                description="matchLabels of the pods")

    _labels = field_validator("namespace_selector", "pod_selector")(_check_optional_labels)

    @model_validator(mode="after")
    def _one_selector(self) -> IngressPeer:
        if self.namespace_selector is None and self.pod_selector is None:
            raise ValueError("a peer needs namespaceSelector, podSelector or both")
        return self


class IngressPolicy(WireModel):
    """A NetworkPolicy per pool: only these peers reach the pods' port (it is also the metrics
    port, so list Prometheus and, when it scrapes pods itself, the operator). Enforced only where
    the cluster's network plugin implements NetworkPolicy."""

    from_: list[IngressPeer] = Field(alias="from", min_length=1, max_length=16)


class TTSPool(PoolSpec):
    """A GPU pool: the core's PoolSpec with the GPU class narrowed to the catalog's names."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.minReplicas <= self.maxReplicas",
         "message": "minReplicas must not exceed maxReplicas"}]})

    gpu_class: GpuClassName = Field(description="a GPU class of the catalog (ttsfleet.catalog)")

    _known = field_validator("gpu_class")(_known_classes)


class TTSDeploymentSpec(WireModel):
    """What a TTS deployment should look like."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.autoscale) || !has(self.autoscale.panicWindowS) || "
                 "!has(self.autoscale.stableWindowS) || "
                 "self.autoscale.panicWindowS <= self.autoscale.stableWindowS",
         "message": "autoscale.panicWindowS must not exceed autoscale.stableWindowS"}]})

    model: ModelSource
    image: str = Field(min_length=1)
    pools: list[TTSPool] = Field(min_length=1, max_length=8)
    # Always present (default 0): the API server answers GET /scale with HTTP 500 while the field
    # that specReplicasPath names is missing, so "unset" cannot mean "autoscaler decides"; 0 does,
    # as it means "scaling disabled" to an HPA.
    replicas: int = Field(
        default=0, ge=0, le=100000,
        description="total replicas over all pools (the scale subresource: kubectl scale, an HPA), "
                    "split by the pools' weights within their bounds; the traffic autoscaler is off "
                    "while it is above 0. 0: the traffic autoscaler decides")
    quantization: QuantRequestField = Field(
        default="auto", description=GpuCatalog.default().quantization_text())
    serving: ServingSpec = ServingSpec()
    autoscale: AutoscaleConfig = AutoscaleConfig()
    resources: Resources = Resources()
    node_selector: dict[str, str] = Field(default_factory=dict, json_schema_extra=_NODE_SELECTOR_RULES)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    env: list[EnvVar] = Field(default_factory=list)
    api_key_secret: ApiKeySecret | None = Field(
        default=None, description="the Secret key whose comma-separated API keys the pods require")
    network_policy: IngressPolicy | None = Field(
        default=None, description="a NetworkPolicy per pool admitting only these peers")

    _selector = field_validator("node_selector")(_check_node_selector)

    @model_validator(mode="after")
    def _unique_pools(self) -> TTSDeploymentSpec:
        keys = [p.key for p in self.pools]
        if len(set(keys)) != len(keys):
            raise ValueError(f"pool names must be unique (a pool's name defaults to its gpuClass): {keys}")
        return self

    def max_running_requests(self, gpu_class: str, catalog: GpuCatalog) -> int:
        if self.serving.max_running_requests is not None:
            return self.serving.max_running_requests
        return catalog.get(gpu_class).serving.max_running_requests

    def cuda_graph_max_bs(self, gpu_class: str, catalog: GpuCatalog) -> int:
        if self.serving.cuda_graph_max_bs is not None:
            return self.serving.cuda_graph_max_bs
        return cuda_graph_max_bs(self.max_running_requests(gpu_class, catalog))


class VolumeRef(WireModel):
    """A PersistentVolumeClaim mounted into fill pods."""

    claim_name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    mount_path: str = Field(pattern=r"^/.*")


class FillJobSpec(WireModel):
    """Preemptible, checkpointable data-cleaning work that fills idle GPUs."""

    image: str = Field(min_length=1)
    command: list[str] = Field(default_factory=lambda: ["ttsfleet", "fill", "run"], min_length=1)
    manifest: str = Field(min_length=1, description="dataset manifest path inside the pod")
    output: str = Field(min_length=1, description="output directory inside the pod")
    stages: list[str] = Field(
        default_factory=list, max_length=32,
        description=f"cleaning stages ({', '.join(registry.names())}); empty = the default ones",
        # The registry's names as the schema enum: an unknown stage is refused when the FillJob is
        # created, not when a pod starts (regenerate the CRDs after registering a stage).
        json_schema_extra={"items": {"type": "string", "enum": list(registry.names())}})
    data_volume: VolumeRef | None = Field(default=None, description="PVC with manifest and output")
    checkpoint_volume: VolumeRef = Field(description="PVC for checkpoints (one sub-dir per FillJob, "
                                                     "one file per shard)")
    shards: int = Field(default=1, ge=1, le=100000, description="the manifest is split in N shards")
    gpu_classes: list[GpuClassName] = Field(min_length=1)

    _known = field_validator("gpu_classes")(_known_classes)
    _stages = field_validator("stages")(registry.check)
    gpus_per_pod: int = Field(default=1, ge=1, le=8)
    max_parallelism: int = Field(default=8, ge=1, le=10000)
    max_failures_per_shard: int = Field(
        default=3, ge=0, description="crashes (exit code other than 0 and 99) before a shard is given up")
    policy: FillPolicyConfig = FillPolicyConfig()
    resources: Resources = Resources(cpu="4", memory="16Gi")
    node_selector: dict[str, str] = Field(default_factory=dict, json_schema_extra=_NODE_SELECTOR_RULES)
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    kernel_cache: KernelCache | None = Field(
        default=None, description="where compiled GPU kernels persist across the shards' pods (else "
                                  "each pod, preempted ones restarting included, compiles them again)")

    _selector = field_validator("node_selector")(_check_node_selector)


# --- status -------------------------------------------------------------------------------------


class Condition(WireModel):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0


class PoolStatus(WireModel):
    name: str
    gpu_class: str
    desired: int = 0
    current: int = 0
    ready: int = 0
    quantization: str = ""
    cuda_graph_max_bs: int = 0


class ScalingRecord(WireModel):
    """One autoscaling decision, kept in a short history (newest last)."""

    time: str
    pool: str
    from_replicas: int
    to_replicas: int
    direction: Literal["up", "down", "none"]
    reason: str
    message: str = ""


class HeldRecommendation(WireModel):
    """A recommendation the scale-down stabilization window may still pick (time: UTC, rounded up)."""

    pool: str
    replicas: int
    time: str


class LatestRecommendation(WireModel):
    """A pool's newest recommendation (a restarted operator counts it from the restart)."""

    pool: str
    replicas: int


class AutoscalerMemory(WireModel):
    """The autoscaler's memory between steps, restored after a restart; written when it changes."""

    recommendations: list[HeldRecommendation] = Field(default_factory=list)
    latest: list[LatestRecommendation] = Field(default_factory=list)
    panic_until: str = Field(default="", description="panic mode lasts until (UTC); empty: no panic")
    last_panic: str = Field(default="", description="the last panic step (UTC, rounded up): what "
                            "burstHoldS counts from; empty: none yet")


class TTSDeploymentStatus(WireModel):
    observed_generation: int = 0
    pools: list[PoolStatus] = Field(default_factory=list)
    desired_replicas: int = 0
    ready_replicas: int = 0
    replicas: int = Field(default=0, description="the pools' Deployments' replicas (scale subresource)")
    selector: str = Field(default="", description="label selector of the inference pods (scale subresource)")
    summary: str = Field(default="", description="pool:ready/desired, for kubectl get")
    last_decisions: list[ScalingRecord] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)
    autoscaler: AutoscalerMemory | None = None
    network_policies: list[str] = Field(default_factory=list,
                                        description="NetworkPolicies made for spec.networkPolicy")


class FillDecision(WireModel):
    time: str
    gpu_class: str
    action: Literal["admit", "evict", "hold"]
    count: int = 0
    message: str = ""


class FillJobStatus(WireModel):
    observed_generation: int = 0
    shards_total: int = 0
    shards_done: int = 0
    completed_shards: str = Field(default="", description="done shard indices as ranges, e.g. 0-4,7")
    failed_shards: str = Field(default="", description="shards given up after maxFailuresPerShard")
    shard_failures: dict[str, int] = Field(default_factory=dict)
    running_pods: int = 0
    active_pods: list[str] = Field(default_factory=list, description="fill pods seen last pass")
    accounted_pods: list[str] = Field(default_factory=list,
                                      description="finished pods already counted, deleted next pass")
    preemptions_survived: int = 0
    evictions: int = 0
    lost_work_seconds: float = 0.0
    last_decisions: list[FillDecision] = Field(default_factory=list)
    conditions: list[Condition] = Field(default_factory=list)

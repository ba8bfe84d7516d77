"""Spec → desired objects, as pure functions, strictly validated against Kubernetes 1.31 schemas."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.desired import desired_objects, name_problems, serving_env
from ttsfleet.operator.models import FillJobSpec, TTSDeploymentSpec
from ttsfleet.operator.reconcile import is_subset, patch_for

from tests.operator.helpers import filljob, ttsd
from ttsfleet.catalog import GpuCatalog, cuda_graph_max_bs

CAT = GpuCatalog.default()


def spec(**kw: Any) -> TTSDeploymentSpec:
    return TTSDeploymentSpec.model_validate(ttsd(**kw)["spec"], context={"catalog": CAT})


def objs(s: TTSDeploymentSpec, name: str = "voice") -> list[dict[str, Any]]:
    out = desired_objects(name, s, CAT)
    for o in out:
        o["metadata"]["namespace"] = "ns1"
    return out


def by(kind: str, items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in items if o["kind"] == kind}


@pytest.mark.parametrize("variant", [
    {},
    {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "tts", "effect": "NoSchedule"}],
     "nodeSelector": {"topology.kubernetes.io/zone": "a"}, "env": [{"name": "HF_HOME", "value": "/tmp"}]},
    {"model": {"checkpoint": "s3://bucket/narrator/v3"}, "quantization": "bf16"},
])
def test_every_built_in_object_validates_strictly(variant: dict[str, Any]) -> None:
    items = objs(spec(**variant))
    assert [o["kind"] for o in items].count("Deployment") == 2
    for o in items:
        kubernetes_validate.validate(o, "1.31", strict=True)


def test_deployment_carries_class_serving_config_and_scheduling() -> None:
    deps = by("Deployment", objs(spec()))
    h200, rtx = deps["voice-h200"], deps["voice-rtx5090"]
    for dep, cls, quant in ((h200, "h200", "bsgemm_fp8"), (rtx, "rtx5090", "mxfp8")):
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        env = {e["name"]: e["value"] for e in c["env"]}
        mrr = CAT.get(cls).serving.max_running_requests
        assert env == {**env, "TTSFLEET_HOST": "0.0.0.0", "TTSFLEET_GPU_CLASS": cls,
                       "TTSFLEET_QUANTIZATION": quant,
                       "TTSFLEET_MAX_RUNNING_REQUESTS": str(mrr),
                       "TTSFLEET_CUDA_GRAPH_MAX_BS": str(cuda_graph_max_bs(mrr)),
                       "TTSFLEET_CHECKPOINT": "/models/narrator/v3"}
        expr = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"][0]["matchExpressions"][0]
        assert expr == {"key": "ttsfleet.io/gpu-class", "operator": "In", "values": [cls]}
        assert pod["priorityClassName"] == "ttsfleet-inference"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "20"]
        assert pod["terminationGracePeriodSeconds"] == 20 + 90
        # The selector picks exactly the template's pods.
        sel = dep["spec"]["selector"]["matchLabels"]
        assert sel.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    assert h200["spec"]["replicas"] == 1 and rtx["spec"]["replicas"] == 0


def test_cuda_graph_max_bs_follows_max_running_requests() -> None:
    s = spec(serving={"maxRunningRequests": 24})
    env = {e["name"]: e.get("value", "") for e in serving_env(s, s.pools[0], CAT)}
    assert env["TTSFLEET_CUDA_GRAPH_MAX_BS"] == "24"
    s = spec(serving={"maxRunningRequests": 128})
    env = {e["name"]: e.get("value", "") for e in serving_env(s, s.pools[0], CAT)}
    assert env["TTSFLEET_CUDA_GRAPH_MAX_BS"] == "128"  # every admitted batch: no eager cliff past 64
    s = spec(serving={"maxRunningRequests": 128, "cudaGraphMaxBs": 96})
    assert s.cuda_graph_max_bs("h200", CAT) == 96


def test_services_and_pdbs_select_their_pool() -> None:
    items = objs(spec())
    svcs, pdbs = by("Service", items), by("PodDisruptionBudget", items)
    assert sorted(svcs) == ["voice", "voice-h200", "voice-rtx5090"]
    assert svcs["voice-h200"]["spec"]["selector"] == {"app.kubernetes.io/instance": "voice",
                                                      "ttsfleet.io/pool": "h200"}
    assert svcs["voice"]["spec"]["selector"]["ttsfleet.io/workload"] == "inference"
    assert pdbs["voice-rtx5090"]["spec"]["selector"]["matchLabels"]["ttsfleet.io/pool"] == "rtx5090"


def test_long_names_are_reported() -> None:
    assert name_problems("x" * 60, spec())
    assert not name_problems("voice", spec())


def test_diff_ignores_server_defaults_and_replicas() -> None:
    dep = by("Deployment", objs(spec()))["voice-h200"]
    live = {**dep, "metadata": {**dep["metadata"], "uid": "u", "resourceVersion": "7"},
            "spec": {**dep["spec"], "replicas": 5, "revisionHistoryLimit": 10}}
    live["spec"]["template"] = {**dep["spec"]["template"]}
    assert patch_for(dep, live, [("spec", "replicas")]) is None
    assert patch_for(dep, live) is not None  # replicas differ when not owned elsewhere
    changed = spec(image="ghcr.io/ttsfleet/inference:v2")
    new = by("Deployment", objs(changed))["voice-h200"]
    patch = patch_for(new, live, [("spec", "replicas")])
    assert patch is not None and "replicas" not in patch["spec"]
    assert patch["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":v2")
    assert is_subset({"a": [{"b": 1}]}, {"a": [{"b": 1, "c": 2}], "d": 3})
    assert not is_subset({"a": [{"b": 1}]}, {"a": [{"b": 1}, {"b": 2}]})


def test_fill_pod_validates_and_shares_the_jobs_checkpoint_directory() -> None:
    s = FillJobSpec.model_validate(filljob(stages=["vad", "loudness"],
                                           dataVolume={"claimName": "data", "mountPath": "/data"})["spec"],
                                   context={"catalog": CAT})
    pod = fv.fill_pod("clean", "ns1", s, 3, "h200", "clean-3-0", CAT)
    kubernetes_validate.validate(pod, "1.31", strict=True)
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--shard") + 1] == "3/6"
    # one directory per FillJob, one file per shard in it (the fill door's layout)
    assert args[args.index("--checkpoint") + 1] == "/checkpoints/clean"
    assert args[args.index("--checkpoint-every-seconds") + 1] == "60"
    assert args[args.index("--stages") + 1] == "vad,loudness"
    assert pod["spec"]["containers"][0]["command"] == ["ttsfleet", "fill", "run"]
    assert pod["spec"]["preemptionPolicy"] == "Never" and pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30


def test_compiled_kernels_go_to_tmp_or_to_the_kernel_cache() -> None:
    """Triton's and Inductor's caches always point somewhere writable (the read-only root has no
    $HOME/.triton); with ``serving.kernelCache`` to the mounted claim or node directory, so a new
    pod finds the kernels an earlier one compiled."""
    fill_spec = FillJobSpec.model_validate(filljob()["spec"], context={"catalog": CAT})
    fill = fv.fill_pod("clean", "ns1", fill_spec, 0, "h200", "clean-0-0", CAT)["spec"]["containers"][0]
    plain = by("Deployment", objs(spec()))["voice-h200"]["spec"]["template"]["spec"]["containers"][0]
    for c in (plain, fill):
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["TRITON_CACHE_DIR"] == "/tmp/triton"
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/torchinductor"  # as docker/inference.Dockerfile
    for cache, source in (({"claimName": "kernels"}, {"persistentVolumeClaim": {"claimName": "kernels"}}),
                          ({"hostPath": "/var/lib/ttsfleet"},
                           {"hostPath": {"path": "/var/lib/ttsfleet", "type": "Directory"}})):
        items = objs(spec(serving={"kernelCache": cache}))
        pod = by("Deployment", items)["voice-h200"]["spec"]["template"]["spec"]
        kubernetes_validate.validate(by("Deployment", items)["voice-h200"], "1.31", strict=True)
        (c,) = pod["containers"]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env["TRITON_CACHE_DIR"] == "/var/cache/ttsfleet/triton"
        assert env["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/ttsfleet/torchinductor"
        (vol,) = [v for v in pod["volumes"] if v["name"] == "kernel-cache"]
        assert vol == {"name": "kernel-cache", **source}
        assert {"name": "kernel-cache", "mountPath": "/var/cache/ttsfleet"} in c["volumeMounts"]


def test_fill_pods_share_a_kernel_cache_across_preemptions() -> None:
    """A preempted shard's next pod finds the kernels the last one compiled (``kernelCache``)."""
    s = FillJobSpec.model_validate(filljob(kernelCache={"claimName": "kernels"})["spec"],
                                   context={"catalog": CAT})
    pod = fv.fill_pod("clean", "ns1", s, 0, "h200", "clean-0-0", CAT)
    kubernetes_validate.validate(pod, "1.31", strict=True)
    (c,) = pod["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["TRITON_CACHE_DIR"] == "/var/cache/ttsfleet/triton"
    claim = {"name": "kernel-cache", "persistentVolumeClaim": {"claimName": "kernels"}}
    assert claim in pod["spec"]["volumes"]
    assert {"name": "kernel-cache", "mountPath": "/var/cache/ttsfleet"} in c["volumeMounts"]


def test_pods_run_hardened_with_writable_tmp() -> None:
    """Inference and fill pods run like the chart's: non-root, read-only root, fsGroup for PVCs."""
    inf = by("Deployment", objs(spec()))["voice-h200"]["spec"]["template"]["spec"]
    fill_spec = FillJobSpec.model_validate(filljob()["spec"], context={"catalog": CAT})
    fill = fv.fill_pod("clean", "ns1", fill_spec, 0, "h200", "clean-0-0", CAT)["spec"]
    for pod in (inf, fill):
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] and sc["runAsUser"] != 0 and sc["fsGroup"] == sc["runAsGroup"]
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        (c,) = pod["containers"]
        assert c["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}}
        tmp = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
        assert tmp and any(v["name"] == tmp[0]["name"] and "emptyDir" in v for v in pod["volumes"])

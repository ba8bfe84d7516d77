"""Issue 13, the operator's part: a B200 added by one catalog file yields valid objects everywhere.

One YAML file (the core test's B200, with a site-specific node label) and nothing else: the
CRDs accept the class, the spec validates against the run's catalog, the Deployment is placed by
the file's node label with the class's scheme and serving env, fill pods use the same label, and
the GPU inventory counts nodes by it. The built-in catalog still rejects the class.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from ttsfleet.operator import fillview as fv
from ttsfleet.operator.crds import crd_documents
from ttsfleet.operator.desired import desired_objects
from ttsfleet.operator.fill import validate as validate_fill
from ttsfleet.operator.inference import validate as validate_ttsd

from tests.operator.helpers import FILL_SPEC, TTSD_SPEC, node
from tests.operator.test_crds import _draft4
from ttsfleet.catalog import GpuCatalog

CAT = GpuCatalog.default()

B200 = textwrap.dedent("""\
    classes:
      b200:
        display_name: NVIDIA B200 180GB
        arch: sm_100a
        memory_gb: 180
        quantization: mxfp8
        node_label: nvidia-b200-sxm
        model_load_s: 90
        relative_cost: 1.4
        serving: {max_running_requests: 96}
        capacity:
          source: "placeholder for tests, not measured"
          points:
            - {concurrency: 1, frames_per_s: 200, ttfa_s: 0.07}
            - {concurrency: 64, frames_per_s: 10000, ttfa_s: 0.10}
    """)


@pytest.fixture
def catalog(tmp_path: Path) -> GpuCatalog:
    f = tmp_path / "b200.yaml"
    f.write_text(B200)
    return GpuCatalog.load(f)


def test_b200_deployment_is_placed_configured_and_valid(catalog: GpuCatalog) -> None:
    raw = {**TTSD_SPEC, "pools": [{"gpuClass": "b200", "minReplicas": 1, "maxReplicas": 4}]}
    assert validate_ttsd(raw, "voice", CAT)[0] is None  # the built-in catalog knows no b200
    spec, problem = validate_ttsd(raw, "voice", catalog)
    assert spec is not None, problem
    objs = desired_objects("voice", spec, catalog)
    (dep,) = [o for o in objs if o["kind"] == "Deployment"]
    kubernetes_validate.validate(dep, "1.31", strict=True)
    pod = dep["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "ttsfleet.io/gpu-class", "operator": "In", "values": ["nvidia-b200-sxm"]}]
    env = {e["name"]: e.get("value", "") for e in pod["containers"][0]["env"]}
    assert env["TTSFLEET_GPU_CLASS"] == "b200"
    assert env["TTSFLEET_QUANTIZATION"] == "mxfp8"  # auto = the class's scheme
    assert env["TTSFLEET_MAX_RUNNING_REQUESTS"] == "96"
    assert env["TTSFLEET_CUDA_GRAPH_MAX_BS"] == "64"


def test_b200_fill_pods_and_inventory_use_its_node_label(catalog: GpuCatalog) -> None:
    spec, problem = validate_fill({**FILL_SPEC, "gpuClasses": ["b200"]}, "clean", catalog)
    assert spec is not None, problem
    pod = fv.fill_pod("clean", "ns1", spec, 0, "b200", "clean-0-0", catalog)
    kubernetes_validate.validate(pod, "1.31", strict=True)
    assert pod["spec"]["nodeSelector"] == {"ttsfleet.io/gpu-class": "nvidia-b200-sxm"}
    nodes = [node("b-1", "nvidia-b200-sxm", gpus=8), node("h-1", "h200", gpus=4)]
    obs = fv.observe(nodes, [pod], 0.0, 0.0, 60.0, catalog)
    assert obs["b200"].total_gpus == 8 and obs["h200"].total_gpus == 4
    assert [j.id for j in obs["b200"].fill_jobs] == ["ns1/clean-0-0"]  # pending, counted by its label


def test_b200_crds_accept_the_class(catalog: GpuCatalog) -> None:
    docs = crd_documents(catalog)
    for doc in docs.values():
        kubernetes_validate.validate(doc, "1.31", strict=True)
    ttsd = docs["ttsdeployments.ttsfleet.io.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {"apiVersion": "ttsfleet.io/v1alpha1", "kind": "TTSDeployment", "metadata": {"name": "v"},
           "spec": {**TTSD_SPEC, "pools": [{"gpuClass": "b200"}]}}
    jsonschema.Draft4Validator(_draft4(ttsd)).validate(obj)
    default = crd_documents(CAT)["ttsdeployments.ttsfleet.io.yaml"]["spec"]["versions"][0]["schema"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(_draft4(default["openAPIV3Schema"])).validate(obj)

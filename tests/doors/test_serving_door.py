"""The serving door, crossed: what the operator writes into a server pod is what the server reads.

For every GPU class of the run's catalog — the built-in one, and one with a B200 added by a
catalog file — the operator's desired objects are laid out as the pod would see them (env, the
catalog ConfigMap mounted, the model volume) and handed to the server's own reader,
``ServeConfig.from_env``, and to the ``ttsfleet serve`` command's parser. Without the catalog
hand-off this fails for b200 exactly as the issue found it: ``unknown GPU class 'b200'``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ttsfleet.operator.desired import desired_objects
from ttsfleet.operator.models import TTSDeploymentSpec

from tests.catalogs import B200_YAML
from tests.doors.cli import parse
from tests.doors.pods import materialize
from ttsfleet.catalog import GpuCatalog

MODEL = "/models/narrator/v3"


def deployment_spec(gpu_class: str, catalog: GpuCatalog) -> TTSDeploymentSpec:
    raw = {"model": {"checkpoint": "pvc://models/narrator/v3"}, "image": "ghcr.io/ttsfleet/inference:test",
           "pools": [{"gpuClass": gpu_class, "minReplicas": 1, "maxReplicas": 2}]}
    return TTSDeploymentSpec.model_validate(raw, context={"catalog": catalog})


def server_pod(gpu_class: str, catalog: GpuCatalog, root: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """The pool's pod template and the server's environment, laid out under ``root``."""
    objs = desired_objects("voice", deployment_spec(gpu_class, catalog), catalog)
    dep = next(o for o in objs if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    env = materialize(pod, objs, root)
    # the model PVC holds the checkpoint directory
    Path(env["TTSFLEET_CHECKPOINT"]).mkdir(parents=True, exist_ok=True)
    return pod, env


@pytest.fixture(params=["built-in", "b200-file"])
def catalog(request: pytest.FixtureRequest, tmp_path: Path) -> GpuCatalog:
    if request.param == "built-in":
        return GpuCatalog.default()
    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML)
    return GpuCatalog.load(f)


def test_every_class_of_the_runs_catalog_makes_a_server_config(catalog: GpuCatalog, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from ttsfleet.inference.serve_config import ServeConfig

    for cls in catalog.names():
        pod, env = server_pod(cls, catalog, tmp_path / cls)
        cfg = ServeConfig.from_env(env)
        (container,) = pod["containers"]
        assert cfg.gpu_class == cls
        assert cfg.gpu_catalog == catalog  # the run's catalog, not the built-in one
        assert cfg.quantization == catalog.get(cls).quantization  # auto = the class's scheme there
        assert cfg.max_running_requests == catalog.get(cls).serving.max_running_requests
        # it listens on the pod IP (the server's default is loopback) at the port the Service targets
        assert (cfg.host, cfg.port) == ("0.0.0.0", container["ports"][0]["containerPort"])
        assert Path(cfg.checkpoint).is_dir() and cfg.checkpoint.endswith(MODEL)
        # the container's command line parses with this environment (the CLI reads it too)
        assert container["command"][:2] == ["ttsfleet", "serve"]
        parse(["serve"], [*container["command"][2:], *container.get("args", [])], env, monkeypatch)


def test_the_catalog_file_in_the_pod_is_the_runs_catalog(tmp_path: Path) -> None:
    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML)
    catalog = GpuCatalog.load(f)
    _, env = server_pod("b200", catalog, tmp_path / "pod")
    assert GpuCatalog.load(env["TTSFLEET_CATALOG"]) == catalog

"""The run's GPU catalog file (``--catalog`` / ``TTSFLEET_CATALOG``) decides a replica's class
defaults, its ``auto`` scheme and its kernel dispatch: a B200 is one file, no code change."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ttsfleet.inference import loader
from ttsfleet.inference.server import ENV, ServeConfig
from ttsfleet.kernels import dispatch

from tests.catalogs import B200_YAML
from ttsfleet.errors import UserError

from .conftest import metric_value


@pytest.fixture()
def b200_file(tmp_path: Path) -> Path:
    path = tmp_path / "b200.yaml"
    path.write_text(B200_YAML)
    return path


@pytest.fixture(autouse=True)
def _builtin_catalog_after():  # noqa: ANN202
    yield
    dispatch.use_catalog(None)


def test_the_run_catalog_drives_quantization_and_kernel_dispatch(b200_file: Path) -> None:
    assert dispatch.plan_for_capability((10, 0)).gpu_classes == ()  # the built-in catalog has no sm_100
    cfg = ServeConfig.from_env({ENV["catalog"]: str(b200_file), ENV["gpu_class"]: "b200"})
    b200 = cfg.gpu_catalog.get("b200")
    assert cfg.quantization == b200.quantization == "mxfp8"  # auto: the class the file adds
    assert cfg.max_running_requests == b200.serving.max_running_requests
    # the server's load path: the resolved catalog goes to the loader, which hands it to the dispatch
    quant = loader.resolve_quantization(cfg.quantization, torch.device("cpu"), cfg.gpu_catalog)
    model = loader.load_model("tiny", device="cpu", quantize=quant, catalog=cfg.gpu_catalog)
    assert model.quantization == "mxfp8"
    assert dispatch.run_catalog() is cfg.gpu_catalog
    plan = dispatch.plan_for_capability((10, 0))  # what a B200 (sm_100a) of this run would run
    assert plan.gpu_classes == ("b200",) and plan.scheme == "mxfp8"
    expected = b200.kernel_backend if b200.kernel_backend == "reference" or dispatch.triton_importable() \
        else "reference"
    assert plan.backend == expected
    assert dispatch.plan_for_capability((9, 0)).gpu_classes == ("h200",)  # built-in classes stay


def test_a_bad_catalog_file_is_one_readable_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("classes: [b200]\n")
    with pytest.raises(UserError, match="catalog .*bad.yaml"):
        ServeConfig.from_env({ENV["catalog"]: str(bad)})
    with pytest.raises(UserError, match="catalog"):
        ServeConfig.from_env({}, catalog=str(tmp_path / "missing.yaml"))


def test_serve_catalog_flag_reaches_the_running_server(server_factory, b200_file: Path) -> None:
    server = server_factory("--catalog", str(b200_file), "--gpu-class", "b200", "--max-running-requests", "2")
    with server.client() as client:
        build = metric_value(client, "ttsfleet_inference_build_info", gpu_class="b200", quantization="mxfp8")
    assert build == 1

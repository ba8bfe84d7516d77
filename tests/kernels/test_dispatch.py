"""Kernel dispatch comes from the GPU catalog, in one place, and the switch is read once."""

from __future__ import annotations

import pytest
import torch
from ttsfleet.kernels import dispatch

from ttsfleet.catalog import GpuCatalog


@pytest.fixture(autouse=True)
def _restore():  # noqa: ANN202
    yield
    dispatch.configure()


def test_h200_runs_the_triton_kernels_and_unknown_gpus_the_reference() -> None:
    h200 = dispatch.plan_for_capability((9, 0))
    assert h200.gpu_classes == ("h200",) and h200.scheme == "bsgemm_fp8"
    assert h200.fused == dispatch.triton_importable()
    old = dispatch.plan_for_capability((8, 0))
    assert old.backend == "reference" and old.scheme == "bf16" and old.gpu_classes == ()
    assert dispatch.plan_for_capability((9, 0), kernel_mode="reference").backend == "reference"


def test_a_new_gpu_class_is_one_catalog_entry(tmp_path) -> None:  # noqa: ANN001
    """A B200 (sm_100a, mxfp8) described in a catalog file gets its dispatch without code changes."""
    path = tmp_path / "b200.yaml"
    h200 = GpuCatalog.default().get("h200").model_dump()
    b200 = {**h200, "name": "b200", "display_name": "NVIDIA B200", "arch": "sm_100a", "quantization": "mxfp8",
            "kernel_backend": "triton", "node_label": "b200"}
    for key in ("activation_block", "weight_block", "scale_format"):
        b200.pop(key)
    import yaml

    path.write_text(yaml.safe_dump({"classes": {"b200": b200}}))
    p = dispatch.plan_for_capability((10, 0), GpuCatalog.from_file(path))
    assert p.gpu_classes == ("b200",) and p.scheme == "mxfp8"
    assert p.fused == dispatch.triton_importable()
    assert dispatch.plan_for_capability((10, 0)).backend == "reference"  # the built-in catalog has none


def test_sm120_runs_the_reference_built_in_and_triton_with_the_shipped_site_override(tmp_path) -> None:  # noqa: ANN001
    """RTX 5090 / RTX PRO 6000: the built-in catalog keeps the torch reference (no sm_120 run has
    measured the kernels); ``kernels/catalog_sm120_triton.yaml`` is the one-file switch to Triton."""
    from pathlib import Path

    import ttsfleet.kernels as kernels_pkg
    import yaml

    built_in = dispatch.plan_for_capability((12, 0))
    assert built_in.backend == "reference" and built_in.scheme == "mxfp8"
    assert built_in.gpu_classes == ("rtx5090", "rtx6000pro")
    override = Path(kernels_pkg.__file__).with_name("catalog_sm120_triton.yaml")
    p = dispatch.plan_for_capability((12, 0), GpuCatalog.from_file(override))
    assert p.gpu_classes == ("rtx5090", "rtx6000pro") and p.scheme == "mxfp8"
    assert p.fused == dispatch.triton_importable()
    assert dispatch.plan_for_capability((9, 0), GpuCatalog.from_file(override)).gpu_classes == ("h200",)
    half = tmp_path / "half.yaml"  # one class of the arch flipped alone: refused, not half-applied
    half.write_text(yaml.safe_dump({"classes": {"rtx5090": {"kernel_backend": "triton"}}}))
    with pytest.raises(ValueError, match="share arch sm_120a"):
        GpuCatalog.from_file(half)


def test_the_switch_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.ENV, "reference")
    dispatch.configure()
    assert dispatch.mode() == "reference"
    monkeypatch.setenv(dispatch.ENV, "interpret")
    assert dispatch.mode() == "reference"  # a later change of the environment is not seen per call
    assert not dispatch.use_triton(torch.zeros(1))
    dispatch.configure()
    assert dispatch.mode() == "interpret"


def test_a_bad_switch_value_is_one_readable_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dispatch.ENV, "fast")
    with pytest.raises(ValueError, match="TTSFLEET_KERNELS='fast'"):
        dispatch.configure()
    with pytest.raises(ValueError, match="kernel mode"):
        dispatch.configure("triton")  # type: ignore[arg-type]


def test_cpu_runs_the_reference_unless_interpreting() -> None:
    dispatch.configure("auto")
    assert dispatch.backend_name(torch.zeros(1)) == "reference"


def test_the_built_in_h200_splits_and_the_benchmarks_file_turns_the_split_off() -> None:
    """Built in since 2026-12-02: prefill-sized GEMMs on the H200 go to cuBLAS (and since 2026-12-03
    decode batches of 128 rows, since 2026-12-07f of 65 and more), smaller decode batches stay ours,
    sm_120 untouched;
    ``benchmarks/inference_h200/catalog_h200_triton_prefill.yaml`` (the
    side-by-side runs' site file) sends the H200's prefill back to Triton."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks/inference_h200/catalog_h200_triton_prefill.yaml"
    cat = GpuCatalog.from_file(path)
    split, triton_only = dispatch.plan_for_capability((9, 0)), dispatch.plan_for_capability((9, 0), cat)
    assert triton_only.prefill_gemm == "triton" and not triton_only.large_gemm(4096)
    assert split.prefill_gemm == "cublas_blockwise" and split.prefill_min_rows == 65
    if split.fused:  # the decision needs the Triton path (a CUDA device or the interpreter)
        assert split.large_gemm(65) and split.large_gemm(128) and not split.large_gemm(64)
    assert dispatch.plan_for_capability((12, 0)).prefill_gemm == "triton"

"""One quantization vocabulary; the catalog's dispatch by compute capability; the serving env."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from ttsfleet.catalog import NODE_LABEL_KEY, GpuCatalog, compute_capability
from ttsfleet.contracts import serving as serving_env
from ttsfleet.errors import UserError
from ttsfleet.quantization import (
    CHOICES,
    SCHEMES,
    QuantRequestField,
    is_fp8,
    parse_quantization,
    parse_scheme,
)


def test_vocabulary_and_the_none_alias():
    assert CHOICES == ("auto", "bsgemm_fp8", "mxfp8", "bf16")
    assert SCHEMES == ("bsgemm_fp8", "mxfp8", "bf16")
    assert parse_quantization("none") == "bf16"
    assert parse_quantization(" MXFP8 ") == "mxfp8"
    assert parse_quantization("auto") == "auto"
    with pytest.raises(UserError, match=r"^unknown quantization 'int4' \(choose from auto, "):
        parse_quantization("int4")
    with pytest.raises(UserError, match="not auto"):
        parse_scheme("auto")
    assert is_fp8("bsgemm_fp8") and not is_fp8("none") and not is_fp8("bf16")

    class M(BaseModel):
        q: QuantRequestField = "auto"

    assert M(q="none").q == "bf16"  # accepted on input, stored canonical
    with pytest.raises(ValueError):
        M(q="fp4")


def test_dispatch_by_compute_capability():
    cat = GpuCatalog.default()
    assert compute_capability("sm_90a") == (9, 0) and compute_capability("sm_120a") == (12, 0)
    assert compute_capability("sm_100a") == (10, 0)
    h = cat.dispatch_for_capability(9, 0)
    assert (h.gpu_classes, h.quantization, h.kernel_backend) == (("h200",), "bsgemm_fp8", "triton")
    b = cat.dispatch_for_capability(12, 0)
    assert (b.gpu_classes, b.quantization, b.kernel_backend) == (
        ("rtx5090", "rtx6000pro"), "mxfp8", "reference")
    unknown = cat.dispatch_for_capability(8, 0)  # an A100: no class, no FP8
    assert (unknown.gpu_classes, unknown.quantization) == ((), "bf16")


def test_classes_of_one_arch_must_agree(tmp_path):
    f = tmp_path / "cat.yaml"
    f.write_text("classes:\n  rtx5090:\n    quantization: bf16\n")
    with pytest.raises(UserError, match="share arch sm_120a"):
        GpuCatalog.load(f)
    f.write_text("classes:\n  rtx5090:\n    node_label: h200\n")
    with pytest.raises(UserError, match="share node label"):
        GpuCatalog.load(f)
    f.write_text("classes:\n  h200: [1\n")
    with pytest.raises(UserError, match=r"^catalog .*cat.yaml: "):
        GpuCatalog.load(f)
    assert GpuCatalog.load(None) == GpuCatalog.default()


def test_node_labels_and_descriptions():
    cat = GpuCatalog.default()
    assert cat.get("h200").node_selector() == {NODE_LABEL_KEY: "h200"}
    assert cat.class_of_node({NODE_LABEL_KEY: "rtx5090", "x": "y"}).name == "rtx5090"
    assert cat.class_of_node({}) is None and cat.class_for_node_label("a100") is None
    assert cat.names_text() == "h200 | rtx5090 | rtx6000pro"
    assert "h200 (sm_90a): bsgemm_fp8" in cat.quantization_text()
    assert cat.markdown_table().count("\n") == 2 + len(cat.classes) - 1
    assert cat.relative_throughput("h200") == 1.0 and cat.relative_throughput("rtx5090") < 1


def test_serving_env_contract_is_prefixed_and_unique():
    names = list(serving_env.SERVER_ENV.values())
    assert len(set(names)) == len(names)
    assert all(n.startswith(serving_env.PREFIX) for n in names)
    env = {serving_env.GPU_CLASS: " h200 ", serving_env.PORT: "", "OTHER": "1"}
    assert serving_env.read_server_env(env) == {"gpu_class": "h200"}

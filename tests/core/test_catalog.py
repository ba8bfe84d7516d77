"""GPU class catalog: classes, serving defaults, capacity curves, overrides."""

from __future__ import annotations

import json

import pytest

from tests.served_runs import SERVED_RUN, nvml_busy, served_points
from ttsfleet.catalog import CapacityCurve, CapacityPoint, GpuCatalog, UnknownGpuClass, cuda_graph_max_bs


def test_classes_and_schemes():
    cat = GpuCatalog.default()
    assert cat.names() == ["h200", "rtx5090", "rtx6000pro"]
    h200 = cat.get("h200")
    assert (h200.arch, h200.quantization, h200.weight_block, h200.activation_block) == (
        "sm_90a", "bsgemm_fp8", (128, 128), (1, 128))
    for name in ("rtx5090", "rtx6000pro"):
        c = cat.get(name)
        assert (c.arch, c.quantization, c.activation_block, c.scale_format) == (
            "sm_120a", "mxfp8", (1, 32), "ue8m0")
    assert cat.get("rtx5090").memory_gb == 32 and cat.get("rtx6000pro").memory_gb == 96


@pytest.mark.parametrize(("mrr", "bs"), [(1, 1), (24, 24), (64, 64), (65, 65), (256, 256)])
def test_cuda_graph_max_bs(mrr, bs):
    assert cuda_graph_max_bs(mrr) == bs
    with pytest.raises(ValueError):
        cuda_graph_max_bs(0)


def test_default_curves_are_the_served_measurement_and_the_writeup_stays_named():
    served = served_points()
    assert sorted(served) == [1, 64, 128]
    cat = GpuCatalog.default()
    h200 = cat.get("h200")
    h = h200.capacity
    assert h.source.startswith("measured") and SERVED_RUN.name in h.source
    # the built-in H200 curve is the recorded served run, point by point (frames/s, first audio
    # p50, NVML busy), up to the concurrency an H200 replica admits (the run's own slot count)
    assert h200.serving.max_running_requests == 128
    assert [p.concurrency for p in h.points] == sorted(served)
    for p in h.points:
        assert p.frames_per_s == pytest.approx(served[p.concurrency]["frames_per_s"], abs=0.05)
        assert p.ttfa_s == pytest.approx(served[p.concurrency]["ttfa_s"])
        assert p.gpu_busy == pytest.approx(nvml_busy(p.concurrency), abs=0.0005)
    # the capacity bound the curve carries is the one these points meet
    meets = [c for c, pt in served.items() if pt["rtf_p99"] <= 0.5 and pt["ttfa_p99_s"] <= 0.25]
    assert h.slo_concurrency == max(meets) == 64
    assert h.peak_frames_per_s == h.frames_per_s(h200.serving.max_running_requests)
    r = cat.get("rtx5090").capacity
    assert r.source.startswith("estimate")
    assert r.frames_per_s(64) == pytest.approx(h.frames_per_s(64) * 5869 / 8006, rel=1e-3)
    w = cat.with_named_curve("h200", "writeup").get("h200").capacity
    assert w.frames_per_s(64) == pytest.approx(8006)
    assert w.scaling() == pytest.approx(52, rel=0.01)
    assert w.ttfa_s(1) == pytest.approx(0.073) and w.ttfa_s(64) == pytest.approx(0.110)
    assert w.source.startswith("borrowed")
    # monotone, interpolated between points, linear below the first point
    xs = [h.frames_per_s(c) for c in (0.5, 1, 3, 10, 40, 64, 100)]
    assert xs == sorted(xs)
    assert h.frames_per_s(0.5) == pytest.approx(h.frames_per_s(1) / 2)


def test_measured_curve_replaces_seed(tmp_path):
    doc = {"source": "bench 2026-11-30", "points": [
        {"concurrency": 1, "frames_per_s": 200, "ttfa_s": 0.05},
        {"concurrency": 64, "frames_per_s": 12000, "ttfa_s": 0.09}]}
    f = tmp_path / "curve.json"
    f.write_text(json.dumps(doc))
    cat = GpuCatalog.default().with_measured_file("h200", f)
    assert cat.get("h200").capacity.frames_per_s(64) == 12000
    assert cat.get("h200").capacity.source == "bench 2026-11-30"
    assert GpuCatalog.default().get("h200").capacity.frames_per_s(64) == pytest.approx(
        served_points()[64]["frames_per_s"], abs=0.1)


def test_unknown_class_and_bad_curves(tmp_path):
    with pytest.raises(UnknownGpuClass, match="known: h200"):
        GpuCatalog.default().get("a100")
    with pytest.raises(ValueError, match="duplicate"):
        CapacityCurve(points=(CapacityPoint(concurrency=1, frames_per_s=1, ttfa_s=1),
                              CapacityPoint(concurrency=1, frames_per_s=2, ttfa_s=1)))
    f = tmp_path / "cat.yaml"
    f.write_text("classes:\n  h200:\n    model_load_s: 30\n")
    assert GpuCatalog.from_file(f).get("h200").model_load_s == 30
    f.write_text("nope: 1\n")
    with pytest.raises(ValueError, match="classes"):
        GpuCatalog.from_file(f)


def test_every_built_in_curve_stops_at_what_its_class_admits():
    """A curve point past a class's slots would claim throughput its replica never reaches (and
    inflate the load shares and dashboards built on the peak); an estimate borrows no NVML busy."""
    cat = GpuCatalog.default()
    for name in cat.names():
        cls = cat.get(name)
        assert cls.capacity.max_concurrency <= cls.serving.max_running_requests, name
        if not cls.capacity.source.startswith("measured"):
            assert all(p.gpu_busy is None for p in cls.capacity.points), name
            assert cls.capacity.slo_concurrency is None, name
    rtx = cat.get("rtx5090")
    assert rtx.capacity.max_concurrency == 64 == rtx.serving.max_running_requests


def test_the_catalog_codec_layouts_are_the_servers():
    """A class's codec layout is one the server accepts (the contract's list), and a bad one is
    refused when the catalog loads, not when a pod starts."""
    from typing import get_args

    import pydantic

    from ttsfleet.catalog import ServingDefaults
    from ttsfleet.contracts.serving import CODEC_LAYOUTS

    assert set(get_args(ServingDefaults.model_fields["codec_layout"].annotation)) == set(CODEC_LAYOUTS)
    with pytest.raises(pydantic.ValidationError):
        ServingDefaults(codec_layout="nhwc")

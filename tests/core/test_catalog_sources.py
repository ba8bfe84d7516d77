"""Provenance of the catalog's figures: every built-in number says where it comes from.

A class's numeric fields are sourced in ``GpuClass.sources`` (kinds: measured, spec, estimate,
borrowed, assumed); a capacity curve in its own ``source``. Site catalog files may add sources and
are rejected, in one line, when a key is not a field or a value names no kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.catalogs import B200_YAML
from ttsfleet.catalog import NAMED_CURVES, SOURCE_KINDS, GpuCatalog, GpuClass
from ttsfleet.errors import UserError

CAT = GpuCatalog.default()


def _numeric_fields(cls: GpuClass) -> dict[str, float]:
    """The class's top-level numbers that are not the field's default (a default needs no source)."""
    out = {}
    for name, info in GpuClass.model_fields.items():
        value = getattr(cls, name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value != info.default:
            out[name] = value
    return out


@pytest.mark.parametrize("name", CAT.names())
def test_every_built_in_figure_has_a_source(name: str) -> None:
    cls = CAT.get(name)
    numbers = _numeric_fields(cls)
    assert {"memory_gb", "model_load_s", "relative_cost"} <= set(numbers)
    missing = sorted(set(numbers) - set(cls.sources))
    assert not missing, f"{name}: no source for {missing}"
    for field, text in cls.sources.items():
        assert text.split(":", 1)[0] in SOURCE_KINDS, (field, text)
    assert cls.sources["memory_gb"].startswith("spec:")


def test_the_kinds_say_what_is_measured_and_what_is_not() -> None:
    h200 = CAT.get("h200")
    assert h200.sources["model_load_s"].startswith("measured:")
    assert "run15-served-curve-final-defaults" in h200.sources["model_load_s"]
    assert h200.sources["prefill_gemm_min_rows"].startswith("measured:")
    assert h200.relative_cost == 1.0 and "by definition" in h200.sources["relative_cost"]
    for name in ("rtx5090", "rtx6000pro"):
        src = CAT.get(name).sources
        assert src["model_load_s"].startswith("assumed:") and "not measured" in src["model_load_s"]
        assert src["relative_cost"].startswith("assumed:")
        assert "no ttsfleet code reads relative_cost" in src["relative_cost"]


def test_every_capacity_curve_states_its_kind() -> None:
    curves = {f"{n} (built-in)": CAT.get(n).capacity for n in CAT.names()}
    curves |= {f"{n} ({named})": c for named, by in NAMED_CURVES.items() for n, c in by.items()}
    for where, curve in curves.items():
        assert curve.source.startswith(("measured:", "estimate:", "borrowed:")), (where, curve.source)


def test_the_rtx_pro_6000_estimate_is_the_rtx_5090_s_by_bandwidth() -> None:
    """Both cards have 1,792 GB/s (NVIDIA's spec sheets): scaled by bandwidth, the curves are equal."""
    pro, rtx = CAT.get("rtx6000pro").capacity, CAT.get("rtx5090").capacity
    assert pro.points == rtx.points
    assert pro.source.startswith("estimate:") and "1,792 GB/s" in pro.source


@pytest.mark.parametrize(("sources", "expect"), [
    ('{memroy_gb: "spec: x"}', "'memroy_gb' is not a field of a GPU class"),
    ('{memory_gb: "the vendor says so"}', "must start with its kind, one of measured:, spec:"),
    ('{memory_gb: "guess: 180"}', "must start with its kind"),
    ('{memory_gb: "spec:"}', "must start with its kind"),
    ('{capacity: "measured: a run"}', "set capacity.source"),
])
def test_a_bad_source_in_a_site_catalog_is_one_readable_line(tmp_path: Path, sources: str,
                                                            expect: str) -> None:
    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML + f"    sources: {sources}\n")
    with pytest.raises(ValueError, match="class 'b200': sources: ") as exc:
        GpuCatalog.from_file(f)
    assert expect in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(UserError) as user:  # what a CLI prints (exit 2)
        GpuCatalog.load(f)
    assert str(user.value).startswith(f"catalog {f}: class 'b200': sources: ")
    assert "\n" not in str(user.value)


def test_site_catalogs_need_no_sources_and_may_give_them(tmp_path: Path) -> None:
    f = tmp_path / "b200.yaml"
    f.write_text(B200_YAML)
    assert GpuCatalog.from_file(f).get("b200").sources == {}
    f.write_text(B200_YAML + '    sources: {memory_gb: "spec: NVIDIA B200 data sheet, 180 GB HBM3e"}\n')
    assert GpuCatalog.from_file(f).get("b200").sources == {
        "memory_gb": "spec: NVIDIA B200 data sheet, 180 GB HBM3e"}


def test_a_changed_figure_loses_the_built_in_source(tmp_path: Path) -> None:
    """A site's own load time is not our run15 measurement: its source goes, the others stay."""
    f = tmp_path / "site.yaml"
    f.write_text("classes:\n  h200:\n    model_load_s: 140\n")
    h200 = GpuCatalog.from_file(f).get("h200")
    assert "model_load_s" not in h200.sources
    assert h200.sources["memory_gb"] == CAT.get("h200").sources["memory_gb"]
    f.write_text('classes:\n  h200:\n    model_load_s: 140\n'
                 '    sources: {model_load_s: "measured: our cluster, 2027-01-10"}\n')
    h200 = GpuCatalog.from_file(f).get("h200")
    assert h200.sources["model_load_s"] == "measured: our cluster, 2027-01-10"
    assert h200.sources["relative_cost"] == CAT.get("h200").sources["relative_cost"]
    side = CAT.with_class("h200", prefill_gemm_min_rows=256).get("h200")
    assert "prefill_gemm_min_rows" not in side.sources and "model_load_s" in side.sources


def test_the_catalog_file_round_trips_its_sources(tmp_path: Path) -> None:
    f = tmp_path / "catalog.yaml"
    f.write_text(CAT.to_yaml())
    assert GpuCatalog.load(f) == CAT

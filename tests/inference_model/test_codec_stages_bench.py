"""``benchmarks/inference_h200/codec_stages.py``'s accounting, on the tiny codec on the CPU: every
stage of a push is seen once per push, its FLOPs are its own (the stages and the remainder add up to
the push's, and double with twice the streams), and the floors are the FLOPs and bytes over the
ceilings given. The GPU figures it exists for come from the H200 (``benchmarks/inference_h200/``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ttsfleet.inference.codec import load_codec

from tests.scripts import load_script

#: 1 TFLOP/s and 1 GB/s: a stage's floors in ms are then its GFLOP x 1 and its MB x 1
UNIT = {"bf16_tflops": 1.0, "copy_gbs": 1.0}


@pytest.fixture(scope="module")
def bench():  # noqa: ANN201
    return load_script("benchmarks/inference_h200/codec_stages.py")


@pytest.fixture(scope="module")
def codec():  # noqa: ANN201
    return load_codec("tiny")


def _report(bench, codec, streams: int):  # noqa: ANN001, ANN202
    with torch.inference_mode():
        return bench.measure(codec, streams, 2, 2, UNIT, layout=False)


def test_every_stage_is_accounted_once_and_the_rest_is_what_they_leave(bench, codec) -> None:  # noqa: ANN001
    report = _report(bench, codec, 2)
    rows = {r["name"]: r for r in report["rows"]}
    names = [n for n, _ in bench.codec_stages(codec)]
    assert list(rows) == [*names, bench.REST]
    assert sum(n.startswith("decoder.model.") for n in names) == 4  # the four upsampling blocks
    for name in names:
        assert rows[name]["gflop"] > 0 and rows[name]["mbytes"] > 0 and rows[name]["ms"] > 0, name
    rest = rows[bench.REST]["gflop"]
    assert 0 <= rest < 0.25 * report["total_gflop"]  # no stage counted twice, none left out unseen
    assert sum(r["gflop"] for r in report["rows"]) == pytest.approx(report["total_gflop"], rel=1e-9)
    for r in report["rows"]:  # at 1 TFLOP/s and 1 GB/s the floors read the stage's own numbers
        assert r["compute_floor_ms"] == pytest.approx(r["gflop"])
        assert r["memory_floor_ms"] == pytest.approx(r["mbytes"])
        assert r["floor_ms"] == max(r["compute_floor_ms"], r["memory_floor_ms"])


def test_a_stage_counts_its_own_push_only(bench, codec) -> None:  # noqa: ANN001
    """Twice the streams, twice each decoder block's FLOPs: the counter spans one forward call."""
    two, four = (_report(bench, codec, n) for n in (2, 4))
    for a, b in zip(two["rows"], four["rows"], strict=True):
        if a["name"].startswith("decoder.model."):
            assert b["gflop"] == pytest.approx(2 * a["gflop"], rel=0.02), a["name"]


def test_the_script_writes_its_table_and_plot(bench, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    if torch.cuda.is_available():
        pytest.skip("on a GPU the script measures the S2-size codec: a device run, not a test")
    bench.main([str(tmp_path), "--streams", "2", "--frames", "1", "--reps", "1"])
    report = json.loads((tmp_path / "codec_stages.json").read_text())
    assert report["ceilings"]["bf16_tflops"] > 0 and report["ceilings"]["copy_gbs"] > 0
    assert (tmp_path / "codec_stages.png").stat().st_size > 1000
    assert "decoder.model.1" in capsys.readouterr().out

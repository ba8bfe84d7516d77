"""``benchmarks/inference_h200/encode_stages.py``'s accounting on the tiny codec on the CPU: every stage
of the fill job's encode is seen once per pass with FLOPs of its own, the stages and the remainder add
up to the pass, each ``--units`` value is a run of its own, and the script writes its report. The GPU
figures it exists for come from the H200 (``benchmarks/inference_h200/``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from ttsfleet.fill_jobs.tokenize import BatchEncoder

from tests.scripts import load_script

UNIT = {"bf16_tflops": 1.0, "copy_gbs": 1.0}  # floors in ms read a stage's GFLOP and MB


@pytest.fixture(scope="module")
def bench():  # noqa: ANN201
    return load_script("benchmarks/inference_h200/encode_stages.py")


def test_every_stage_is_accounted_once_and_the_rest_is_what_they_leave(bench) -> None:  # noqa: ANN001
    enc = BatchEncoder("tiny", 24000, "cpu", 240.0, layout="channels-last")
    x = 0.1 * torch.randn(2, 1, 4 * enc.codec.frame_length, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        run = bench.measure(enc, x, 1, UNIT)
    rows = {r["name"]: r for r in run["rows"]}
    names = [n for n, _ in bench.encode_stages(enc.codec)]
    assert list(rows) == [*names, bench.REST]
    assert sum(n.startswith("encoder.block.") for n in names) == 4  # the four downsampling blocks
    for name in names:
        assert rows[name]["gflop"] > 0 and rows[name]["mbytes"] > 0 and rows[name]["ms"] > 0, name
    assert 0 <= rows[bench.REST]["gflop"] < 0.25 * run["total_gflop"]  # nothing counted twice
    assert sum(r["gflop"] for r in run["rows"]) == pytest.approx(run["total_gflop"], rel=1e-9)
    assert run["audio_s"] == pytest.approx(2 * 4 * enc.codec.frame_length / enc.codec.sample_rate)
    assert run["audio_s_per_s"] == pytest.approx(run["audio_s"] / (run["pass_ms"] / 1000))
    assert run["units"] == "cudnn"  # the reference dispatch here: the units take cuDNN's path
    assert run["codebook_search_ms"] > 0


def test_the_codebook_search_alone_gives_the_encodes_codes(bench) -> None:  # noqa: ANN001
    """The search timed alone is the encode's own: the same codes as the whole pass."""
    enc = BatchEncoder("tiny", 24000, "cpu", 240.0, layout="channels-last")
    x = 0.1 * torch.randn(2, 1, 4 * enc.codec.frame_length, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        _, codes = bench.codebook_search(enc, x, 1)
        whole = enc._codes(x)
    assert codes.shape == whole.shape and codes.shape[1] == enc.codec.num_codebooks
    assert torch.equal(codes, whole)


def test_the_script_writes_a_run_per_units_value(bench, tmp_path: Path, capsys) -> None:  # noqa: ANN001
    if torch.cuda.is_available():
        pytest.skip("on a GPU the script measures the S2-size codec: a device run, not a test")
    bench.main([str(tmp_path), "--clips", "1", "--seconds", "0.2", "--reps", "1", "--units", "fused,cudnn"])
    report = json.loads((tmp_path / "encode_stages.json").read_text())
    assert len(report["runs"]) == 2 and report["ceilings"]["copy_gbs"] > 0 and report["date"]
    out = capsys.readouterr().out
    assert out.count("encoder.block.1") == 2 and "audio-s/s" in out

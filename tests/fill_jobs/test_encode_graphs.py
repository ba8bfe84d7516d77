"""``fill_jobs/encode_graphs.py``: the fill job's encode replayed from a CUDA graph per batch shape
(``BatchEncoder(graphs=True)``, off by default until a GPU times it).

What each test pins down, and how it can fail:
* off CUDA a shape cannot be captured: it runs eagerly, with the reason kept, and gives ``fn``'s
  output (a fallback that returned nothing, or a stale buffer, fails); so does a shape past the cap
  on captured shapes (each keeps its input buffer);
* ``BatchEncoder`` takes graphs on CUDA with bucketed shapes only, and says which it runs;
* ``bench_codec_precision.py --graphs off,on`` measures both, one row each, the backend named;
* on a GPU (skipped in CI): replays give each new batch its own result (not the captured batch's),
  one capture per shape, and the encoder's codes with graphs equal its eager codes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from ttsfleet.fill_jobs.encode_graphs import ShapeGraphs
from ttsfleet.fill_jobs.tokenize import BatchEncoder

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fill_jobs" / "bench_codec_precision.py"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")


def _clips(lengths: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = np.arange(max(lengths)) / 24000
    tones = [0.3 * np.sin(2 * np.pi * (150 + 40 * i) * t[:n]) for i, n in enumerate(lengths)]
    return [(y + 0.01 * rng.standard_normal(len(y))).astype(np.float32) for y in tones]


def test_off_cuda_a_shape_runs_eagerly_and_says_why() -> None:
    calls: list[tuple[int, ...]] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape))
        return x * 2 + 1

    graphs = ShapeGraphs(fn)
    x = torch.arange(6.0).reshape(2, 3)
    torch.testing.assert_close(graphs(x), x * 2 + 1)
    torch.testing.assert_close(graphs(x + 1), x * 2 + 3)  # the new batch's result, not the first one's
    key = ((2, 3), torch.float32, x.device)
    assert not graphs.captured and "CUDA graphs need a CUDA tensor" in graphs.eager_shapes[key]
    assert calls == [(2, 3)] * 2  # the capture failed before calling fn; then one eager call each


def test_shapes_past_the_cap_run_eagerly() -> None:
    graphs = ShapeGraphs(lambda x: x + 1, max_shapes=0)
    x = torch.zeros(3)
    torch.testing.assert_close(graphs(x), x + 1)
    assert graphs.eager_shapes == {((3,), torch.float32, x.device): "over the 0 shapes captured"}


def test_the_encoder_takes_graphs_on_cuda_with_bucketed_shapes_only() -> None:
    enc = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="bf16", layout="channels-last",
                       autotune=True, graphs=True)
    assert enc.bucket_shapes and enc.graphs_backend == "eager"  # the CPU: no graphs
    xs = _clips((24000, 12000))
    eager = BatchEncoder("tiny", 24000, "cpu", 30.0, precision="bf16", layout="channels-last",
                         autotune=True).encode(xs)
    for a, b in zip(enc.encode(xs), eager, strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_bench_measures_graphs_off_and_on(tmp_path: Path) -> None:
    out = tmp_path / "enc.json"
    proc = subprocess.run([sys.executable, "-P", str(BENCH), "run", "--device", "cpu", "--codec", "tiny",
                           "--threads", "1", "--clips", "2", "--clip-seconds", "1", "--repeats", "1",
                           "--precisions", "bf16", "--layouts", "channels-last", "--snakes", "fused",
                           "--autotune", "on", "--graphs", "off,on", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["graphs"] for r in rows] == ["off", "off", "on"]
    assert {r["graphs_backend"] for r in rows} == {"eager"}  # the CPU runs none
    assert "| cuDNN autotuner | graphs | audio-s/s |" in proc.stdout
    bad = subprocess.run([sys.executable, "-P", str(BENCH), "run", "--device", "cpu", "--graphs", "maybe"],
                         capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert bad.returncode != 0 and "--graphs: maybe not among off, on" in bad.stderr


@gpu
def test_replays_give_each_batch_its_own_result() -> None:
    weight = torch.randn(64, 64, device="cuda")
    graphs = ShapeGraphs(lambda x: torch.relu(x @ weight).sum(1))
    xs = [torch.randn(8, 64, device="cuda") for _ in range(3)]
    got = [graphs(x).clone() for x in xs]
    assert len(graphs.captured) == 1 and not graphs.eager_shapes
    for x, y in zip(xs, got, strict=True):
        torch.testing.assert_close(y, torch.relu(x @ weight).sum(1))
    graphs(torch.randn(4, 64, device="cuda"))
    assert len(graphs.captured) == 2


@gpu
@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_graph_codes_equal_eager_codes_on_a_gpu(precision: str) -> None:
    """One encoder, eager then graphed: the autotuner's picks are the same for both (one process,
    the same shapes), so any difference is the graphs'."""
    xs = _clips((24000 + 17, 12345, 9001, 30000, 4097, 12000))
    enc = BatchEncoder("tiny", 24000, "cuda", 30.0, precision=precision, layout="channels-last",
                       autotune=True)
    eager = enc.encode(xs)
    enc.configure("channels-last", autotune=True, graphs=True)
    assert enc.graphs_backend == "graphs"
    first, again = enc.encode(xs), enc.encode(xs[::-1])  # the second pass replays
    assert enc._graphs.captured and not enc._graphs.eager_shapes
    for a, b in zip(first, eager, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(again, first[::-1], strict=True):
        np.testing.assert_array_equal(a, b)

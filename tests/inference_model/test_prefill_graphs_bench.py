"""``benchmarks/inference_h200/prefill_graphs_bench.py`` on the tiny model on the CPU: each side (eager,
piecewise, whole-call) is timed on the same prompts, the whole side only where a call is one piece,
the graph sides' logits are compared with the eager side's, and the report is written. Its figures
(host, done and GPU time of a prefill call per path) come from the GPU (``benchmarks/inference_h200/``)."""

from __future__ import annotations

import json

import pytest
import torch
from ttsfleet.inference.loader import load_model

from tests.scripts import load_script


@pytest.fixture(scope="module")
def bench():  # noqa: ANN201
    return load_script("benchmarks/inference_h200/prefill_graphs_bench.py")


@pytest.fixture(scope="module")
def report(bench, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: ANN001
    if torch.cuda.is_available():
        pytest.skip("on a GPU the script measures the S2 Pro shape: a device run, not a test")
    out = tmp_path_factory.mktemp("prefill_graphs_bench") / "report.json"
    bench.main([str(out), "--model", "tiny", "--device", "cpu", "--calls", "2", "--prompts", "1,2"])
    return json.loads(out.read_text())


def test_prompts_have_the_asked_lengths_and_one_slot_each(bench) -> None:  # noqa: ANN001
    model = load_model("tiny")
    pieces = bench.random_pieces(model, 3, torch.Generator().manual_seed(0), 64, 128)
    assert [p.slot for p in pieces] == [0, 1, 2]
    assert all(64 <= p.tokens.shape[1] < 128 for p in pieces)
    assert all(p.tokens.shape[0] == 1 + model.config.num_codebooks for p in pieces)
    assert all(int(p.tokens[0].max()) < model.config.semantic_begin_id for p in pieces)


def test_the_whole_side_times_one_piece_calls_only(report: dict) -> None:
    calls = {(c["prompts"], c["tokens"]): c for c in report["calls"]}
    assert set(calls) == {(1, "300-400"), (2, "300-400"), (1, "64-128"), (1, "450-510"),
                          (1, "100-160 after 256")}
    for (n, tokens), row in calls.items():
        assert ("whole_gpu_ms" in row) == (n == 1)
        assert "eager_gpu_ms" in row and "piecewise_gpu_ms" in row
        if n == 1:  # the last call's whole graph: the smallest row bucket holding it; causal when fresh,
            rows, keys = row["whole_fit"]  # else the smallest key length past its head
            assert row["rows"] <= rows < row["rows"] + 64
            assert keys == 0 if "after" not in tokens else 256 + row["rows"] <= keys < 2 * (256 + row["rows"])
        else:
            assert row["whole_fit"] is None


def test_each_side_gives_host_done_and_gpu_times_and_agrees_with_eager(report: dict) -> None:
    for row in report["calls"]:
        sides = ["eager", "piecewise"] + (["whole"] if row["prompts"] == 1 else [])
        for side in sides:
            t = {k: row[f"{side}_{k}_ms"]["median"] for k in ("host", "done", "gpu")}
            assert 0 < t["host"] <= t["done"] and t["gpu"] == t["done"]  # on the CPU nothing runs apart
        for side in sides[1:]:
            assert row[f"{side}_logits_rel_err_max"] < 1e-4
            assert row[f"{side}_argmax_agree"] == "2/2"
        assert row["host_outran_sleep"] == []


def test_the_profile_has_each_sides_ops(report: dict) -> None:
    prof = report["profile_one_prompt_x4"]
    assert set(prof) == {"eager", "piecewise", "whole"}
    for ops in prof.values():
        assert ops and all(op["calls"] > 0 and op["self_cpu_us"] >= 0 for op in ops)
        assert any("linear" in op["op"] or "mm" in op["op"] for op in ops)

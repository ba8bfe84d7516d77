"""``benchmarks/inference_h200/codec_units.py`` on the CPU (Triton's interpreter): every variant runs
the same unit (its output checked against the cuDNN-path unit's), a tile variant really launches
with its tile, and the report carries what the table prints. The GPU figures it exists for come from
the H200 (``benchmarks/inference_h200/``)."""

from __future__ import annotations

import argparse

import pytest
import torch

from tests.scripts import load_script


@pytest.fixture(scope="module")
def bench():  # noqa: ANN201
    return load_script("benchmarks/inference_h200/codec_units.py")


def test_every_variant_computes_the_unit(bench, kernels, monkeypatch) -> None:
    if kernels != "interpret":
        pytest.skip("the fused unit runs the Triton kernels (the interpreter here)")
    from ttsfleet.kernels import codec_conv_tiles
    from ttsfleet.kernels import triton_codec_conv as tcc

    tiles = []
    launch = tcc.conv_rows_triton

    def spy(x, weight, bias, out, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        tiles.append(codec_conv_tiles.tile_for(out.shape[1], *weight.shape))  # what the launch resolves
        return launch(x, weight, bias, out, *a, **k)

    monkeypatch.setattr(tcc, "conv_rows_triton", spy)
    args = argparse.Namespace(streams=2, frames=1, rounds=1, reps=1)
    variants = ["cudnn", "fused", "tile 32x16x16x4x2"]
    with torch.inference_mode():
        row = bench.measure(16, args, torch.device("cpu"), variants)
    assert row["width"] == 16 and row["rows"] == 2 * 40 and row["least_bytes"] == 2 * 2 * 16 * 40 * 4
    for v in variants:
        r = row["variants"][v]
        assert r["rel_err_vs_cudnn"] < 1e-5 and len(r["ms_rounds"]) == 1 and r["ms"] > 0
    tile = codec_conv_tiles.ConvTile(32, 16, 16, 4, 2)
    assert tiles.count(tile) >= 2  # the tile variant's both convs ran it
    assert codec_conv_tiles.tile_for(40, 7, 16, 16) != tile  # pins dropped

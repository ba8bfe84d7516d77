"""The fused codec convs' tile lookup (``kernels/codec_conv_tiles.py``): labels, the table file the
sweep writes, and the order pins > shipped table > heuristic (issue #25)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ttsfleet.kernels import codec_conv_tiles as ct
from ttsfleet.kernels.codec_conv_tiles import ConvTile


@pytest.fixture(autouse=True)
def _no_pins():
    ct.pin_tiles(None)
    yield
    ct.pin_tiles(None)


def test_labels_round_trip_and_bad_ones_say_the_form() -> None:
    tile = ConvTile(128, 64, 32, 8, 3)
    assert tile.label == "128x64x32x8x3" and ConvTile.parse(tile.label) == tile
    for bad, why in (("128x64x32x8", "expected BTxBNxBKxWARPSxSTAGES"),
                     ("128x48x32x8x3", "BN must be a power"),
                     ("128x64x8x8x3", "BK must be a power of two >= 16"), ("axbxcxdxe", "expected")):
        with pytest.raises(ValueError, match=why):
            ConvTile.parse(bad)


def test_default_tile_follows_the_widths_and_short_pushes() -> None:
    assert ct.default_tile(4096, 192, 192) == ConvTile(128, 64, 64, 4)
    assert ct.default_tile(4096, 96, 96) == ConvTile(128, 32, 32, 4)
    assert ct.default_tile(4096, 768, 768) == ConvTile(128, 128, 64, 8)
    assert ct.default_tile(20, 768, 768).block_t == 32  # a short push: a short tile


def test_pins_win_over_the_table_which_wins_over_the_heuristic(monkeypatch) -> None:  # noqa: ANN001
    tuned = ConvTile(64, 128, 32, 4, 4)
    monkeypatch.setattr(ct, "_tuned", lambda: {ct.conv_key(7, 96, 96): tuned})
    assert ct.tile_for(8192, 7, 96, 96) == tuned
    assert ct.tile_for(8192, 1, 96, 96) == ct.default_tile(8192, 96, 96)  # not in the table
    assert ct.tile_for(32, 7, 96, 96) == ct.default_tile(32, 96, 96)  # rows shorter than the tile
    pinned = ConvTile(256, 64, 64, 8, 2)
    ct.set_tile(7, 96, 96, pinned)
    assert ct.tile_for(8192, 7, 96, 96) == pinned
    ct.set_tile(7, 96, 96, None)
    assert ct.tile_for(8192, 7, 96, 96) == tuned
    ct.pin_tiles({ct.conv_key(1, 96, 96): pinned})
    assert ct.tile_for(8192, 1, 96, 96) == pinned and ct.tile_for(8192, 7, 96, 96) == tuned


def test_the_table_file_round_trips_and_a_bad_one_names_itself(tmp_path: Path) -> None:
    won = {ct.conv_key(7, 192, 192): (ConvTile(128, 64, 64, 8, 3), 0.51234),
           ct.conv_key(1, 192, 192): (ConvTile(256, 64, 64, 8, 2), 0.2)}
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps(ct.table_json(won, {"gpu": "test", "date": "2026-12-05"})))
    assert ct.read_table(str(path)) == {k: t for k, (t, _) in won.items()}
    assert json.loads(path.read_text())["tiles"]["k7:192:192"] == {"tile": "128x64x64x8x3", "ms": 0.5123}
    path.write_text(json.dumps({"tiles": {"k7:1:1": {"tile": "12x1"}}}))
    with pytest.raises(ValueError, match="tuned.json: not a codec conv tile table"):
        ct.read_table(str(path))


def test_the_shipped_table_if_any_parses_and_covers_tiles_the_kernel_takes() -> None:
    if not Path(ct.TUNED_FILE).exists():
        pytest.skip("no tuned table shipped yet (the GPU sweep writes it)")
    table = ct.read_table(ct.TUNED_FILE)
    assert table and all(k.startswith("k") and t.num_warps in (2, 4, 8, 16) for k, t in table.items())


SWEEP = Path(__file__).resolve().parents[2] / "benchmarks" / "inference_h200" / "codec_tiles.py"


def _sweep_module():  # noqa: ANN202
    from tests.scripts import load_script

    return load_script("benchmarks/inference_h200/codec_tiles.py")


def test_the_sweep_keeps_the_default_unless_a_tile_wins_by_the_margin() -> None:
    pick = _sweep_module()._pick
    row = {"default": {"tile": "a", "ms": 1.0},
           "candidates": [{"tile": "b", "ms": 0.98}, {"tile": "c", "error": "OutOfResources"}]}
    assert pick(row, 0.03)["winner"]["tile"] == "a"  # 2 % faster: noise
    row["candidates"].append({"tile": "d", "ms": 0.9})
    assert pick(row, 0.03)["winner"]["tile"] == "d"
    row["default"] = {"tile": "a", "error": "OutOfResources"}
    assert pick(row, 0.03)["winner"]["tile"] == "d"  # a default that failed: the best that ran


def test_the_sweep_runs_on_the_interpreter_and_writes_a_table_the_lookup_reads(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1", "TTSFLEET_KERNELS": "interpret"}
    proc = subprocess.run([sys.executable, "-P", str(SWEEP), str(tmp_path), "--device", "cpu", "--reps", "1"],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((tmp_path / "codec_tiles.json").read_text())
    assert result["date"] and result["gpu"] == "cpu" and len(result["rows"]) == 2
    for row in result["rows"]:
        tried = [row["default"], *row["candidates"]]
        assert all("ms" in r and r["rel_err"] < 1e-5 for r in tried)  # every tile computed the conv
        assert len({r["tile"] for r in tried}) == len(tried) >= 4  # stage 2 added warps / stages
    table = ct.read_table(str(tmp_path / "tuned_codec_conv.json"))
    assert set(table) == {"k7:16:16", "k1:16:16"}
    assert (tmp_path / "codec_tiles.png").stat().st_size > 0
    assert sum(line.startswith("| decoder |") for line in proc.stdout.splitlines()) == 2

"""``benchmarks/inference_h200/codec_compile.py``'s variant names on the CPU (tiny codec): a
``+window-NAME`` modifier and an ``@table`` suffix each reach the push and are put back after their
variant, and ``@table`` without ``--tile-table`` is refused before any work. A typo here would be
found on the GPU only after a machine start; the timings it exists for come from the device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ttsfleet.kernels import codec_conv_tiles as ct

from tests.scripts import load_script

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "inference_h200" / "codec_compile.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=240)


def test_modified_variants_run_and_report_beside_the_plain_one(tmp_path: Path) -> None:
    table = tmp_path / "tiles.json"
    won = {ct.conv_key(7, 16, 16): (ct.ConvTile(32, 16, 16, 4, 2), 1.0)}
    table.write_text(json.dumps(ct.table_json(won, {"gpu": "test"})))
    out = tmp_path / "cc.json"
    proc = _run(str(out), "--device", "cpu", "--codec", "tiny", "--shapes", "2x1",
                "--variants", "graphs,graphs+window-math@table", "--tile-table", str(table))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert list(report["variants"]) == ["graphs", "graphs+window-math@table"]
    plain, both = report["variants"]["graphs"], report["variants"]["graphs+window-math@table"]
    assert both["push"][0]["streams"] == 2 and both["push"][0]["ms"] > 0
    # the serving codec is bf16: SDPA's math backend rounds the scores to bf16, another error of the
    # same size as the default's (each ~19 dB from float32 on the tiny codec), not a larger one
    assert 10 < both["snr_db_vs_graphs"] < 300  # the backend was switched: the audio moved
    assert abs(both["snr_db_vs_float32"] - plain["snr_db_vs_float32"]) < 1.0
    assert "| graphs+window-math@table |" in proc.stdout


def test_a_table_variant_without_a_table_is_refused(tmp_path: Path) -> None:
    proc = _run(str(tmp_path / "cc.json"), "--device", "cpu", "--codec", "tiny", "--shapes", "1x1",
                "--variants", "fused-units@table")
    assert proc.returncode != 0 and "variant fused-units@table: pass --tile-table FILE" in proc.stderr
    assert not (tmp_path / "cc.json").exists()


def test_an_unknown_modifier_is_refused_before_any_work(tmp_path: Path) -> None:
    proc = _run(str(tmp_path / "cc.json"), "--device", "cpu", "--codec", "tiny", "--shapes", "1x1",
                "--variants", "graphs,graphs+windows-math")
    assert proc.returncode != 0
    assert "variant graphs+windows-math: the one modifier is +window-BACKEND" in proc.stderr
    assert not (tmp_path / "cc.json").exists()  # the plain variant before it did not run either


def test_a_plain_variant_pushes_with_the_served_window_backend() -> None:
    """Without ``+window-NAME`` a variant times what the server runs: the switch's backend on CUDA
    (``efficient`` by default), torch's own choice on the CPU; ``+window-auto`` is torch's anywhere."""
    import torch
    from ttsfleet.inference.codec_batch import CODEC_WINDOW_ATTENTION_SWITCH

    cc = load_script("benchmarks/inference_h200/codec_compile.py")
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert cc.window_backend(None, cuda) == CODEC_WINDOW_ATTENTION_SWITCH.get() == "efficient"
    assert cc.window_backend(None, cpu) is None
    assert cc.window_backend("auto", cuda) is None and cc.window_backend("math", cpu) == "math"

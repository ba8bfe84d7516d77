"""``benchmarks/inference_h200/ab_table.py``: a served A/B call's folder as the README's markdown table,
read from the sides' ``bench.json`` (checked on 2026-12-06c's recorded call 12, whose table was typed by
hand from the text output), the engine cell's GPU and GIL parts, and a bad folder refused in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[2] / "benchmarks" / "inference_h200"
CALL12 = HERE / "2026-12-06c" / "call12-h100-codec-sm-40"
#: its B side's server died at c=128 (2026-12-06e): 1,193 of 1,280 requests failed
CALL4 = HERE / "2026-12-06e" / "call4-h100-qwen-bpe-prompts"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", str(HERE / "ab_table.py"), *args], capture_output=True,
                          text=True, timeout=60, check=False)


def test_a_recorded_call_gives_the_table_typed_by_hand():
    done = _run(str(CALL12))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| c | side | frames/s |") and len(lines) == 2 + 4
    assert lines[2] == ("| 64 | A | 3,532.7 | 95 / 234 | 0.394 / 0.440 | 45.1%, 93 ms | 36.7, 79% | 92.2 % | "
                        "17.5: 4.5 / 1.6 / 4.8 / 6.6 |")
    assert lines[3].startswith("| 64 | B: TTSFLEET_CODEC_SM_PERCENT=40 | 3,747.1 | 118 / 303 |")
    assert [ln.split(" | ")[0] for ln in lines[2:]] == ["| 64", "| 64", "| 128", "| 128"]
    assert "| 219 / 1414 |" in lines[5] and lines[5].endswith("| 96.5 % | 27.4: 3.8 / 2.1 / 6.9 / 14.6 |")


def test_the_engine_cell_gives_gpu_work_the_gil_probe_the_loop_lag_and_gc_where_exported(tmp_path):
    folder = tmp_path / "ab"
    shutil.copytree(CALL12 / "a1" / "served_c64", folder / "a1" / "served_c64")
    bench = folder / "a1" / "served_c64" / "bench.json"
    report = json.loads(bench.read_text())
    report["engine_steady"][0].update(gpu_ms={"decode": 11.2, "prefill": 2.9}, gil_wait_ms=1.234,
                                      gil_probes=80, loop_lag_mean_ms=0.8, loop_lag_p99_ms=42.25,
                                      loop_lag_ticks=2000, gc2_count=3, gc2_total_ms=240.0,
                                      gc2_p99_ms=96.5, gc2_max_le_ms=100.0)
    bench.write_text(json.dumps(report))
    done = _run(str(folder))  # no run-ab.log: no flags, no NVML
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2].endswith(
        "| - | 17.5: 4.5 / 1.6 / 4.8 / 6.6; GPU decode 11.2, prefill 2.9; GIL 1.23; loop late p99 42.2; "
        "gc2 3×, p99 96.5 ms |")


def test_the_first_audio_cell_says_how_late_the_client_read_where_measured(tmp_path):
    folder = tmp_path / "ab"
    shutil.copytree(CALL12 / "a1" / "served_c64", folder / "a1" / "served_c64")
    bench = folder / "a1" / "served_c64" / "bench.json"
    report = json.loads(bench.read_text())
    report["levels"][0]["client_loop_lag"] = {"p50_ms": 0.4, "p99_ms": 37.6, "max_ms": 120.0, "ticks": 4000}
    bench.write_text(json.dumps(report))
    done = _run(str(folder))
    assert done.returncode == 0, done.stderr
    assert " / 234 (client late p99 38) | " in done.stdout.splitlines()[2]
    report["levels"][0]["headers_p99_s"] = 0.5126
    bench.write_text(json.dumps(report))
    done = _run(str(folder))
    assert " / 234 (client late p99 38; headers p99 513) | " in done.stdout.splitlines()[2]
    report["levels"][0]["outside_p99_s"] = 0.4012
    bench.write_text(json.dumps(report))
    done = _run(str(folder))
    cell = " / 234 (client late p99 38; headers p99 513; outside app p99 401) | "
    assert cell in done.stdout.splitlines()[2]


def test_a_folder_without_sides_is_refused_in_one_line(tmp_path):
    done = _run(str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: no <side>/served_c<N>/bench.json under {tmp_path}"
    done = _run(str(tmp_path / "missing"))
    assert done.returncode == 2 and done.stderr.strip().startswith("usage: ab_table.py FOLDER")


def test_a_side_whose_requests_failed_says_so_in_its_frames_cell():
    done = _run(str(CALL4))
    assert done.returncode == 0, done.stderr
    rows = {tuple(ln.split(" | ")[:2]): ln for ln in done.stdout.splitlines()[2:]}
    assert "(**1,193 of 1,280 requests failed**)" in rows[("| 128", "B: --preset-text qwen-bpe")]
    assert "failed" not in rows[("| 64", "B: --preset-text qwen-bpe")]  # no error at c=64
    assert all("failed" not in line for key, line in rows.items() if key[1].startswith("A"))


def test_a_serve_stage_folder_gives_its_one_side():
    """A ``serve`` stage (one server, no B) reads like a side: call 37 of 2026-12-07f on an H200."""
    done = _run(str(HERE / "2026-12-07f" / "call37-h200-served" / "serve"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [ln.split(" | ")[:3] for ln in lines[2:]] == [["| 64", "S: --preset-text qwen-bpe", "5,558.0"],
                                                         ["| 128", "S: --preset-text qwen-bpe", "7,105.4"]]
    assert lines[2].split(" | ")[7] == "95.8 %"  # the NVML line of side "serve" in its log

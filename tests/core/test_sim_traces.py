"""Public trace formats read directly: Azure LLM inference CSV, BurstGPT CSV, Mooncake JSONL.

The excerpts in ``tests/core/traces/`` are written by hand in the published column layouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ttsfleet.catalog import GpuCatalog
from ttsfleet.errors import UserError
from ttsfleet.sim.engine import simulate
from ttsfleet.sim.scenario import Scenario
from ttsfleet.sim.summary import summarize
from ttsfleet.sim.tracefiles import detect_format, load_trace

HERE = Path(__file__).parent / "traces"
AZURE, BURSTGPT, MOONCAKE = (HERE / "azure_llm_excerpt.csv", HERE / "burstgpt_excerpt.csv",
                             HERE / "mooncake_excerpt.jsonl")


def test_formats_are_detected_from_the_first_line(tmp_path):
    assert [detect_format(p) for p in (AZURE, BURSTGPT, MOONCAKE)] == ["azure", "burstgpt", "mooncake"]
    own = tmp_path / "own.csv"
    own.write_text("t,rate\n0,1\n")
    assert detect_format(own) == "csv"
    odd = tmp_path / "odd.csv"
    odd.write_text("when,what\n1,2\n")
    with pytest.raises(UserError, match="unknown trace format"):
        detect_format(odd)


def test_azure_requests_are_binned_per_second_and_replayed_exactly():
    tr = load_trace(AZURE)
    # rows are not sorted; seconds from the first request (18:15:46.68059)
    assert tr.counts.tolist() == [4, 2, 1, 2, 0, 0, 1]
    assert tr.mean_frames[0] == pytest.approx((10 + 8 + 27 + 14) / 4)  # generated tokens
    assert tr.mean_frames[3] == pytest.approx((128 + 64) / 2)
    assert tr.mean_frames[4] == pytest.approx(np.mean([14.75, 21, 33, 96, 16]))  # empty: mean
    # exact replay: the same counts for every seed, no Poisson draw
    assert tr.arrivals(0).tolist() == tr.arrivals(99).tolist() == tr.counts.tolist()


def test_burstgpt_drops_failed_requests_and_mooncake_reads_milliseconds():
    b = load_trace(BURSTGPT)
    assert b.counts.tolist() == [1, 3, 0, 1, 0, 0, 1]  # 0 response tokens = failed, dropped
    assert b.mean_frames[1] == pytest.approx((505 + 110 + 44) / 3)
    m = load_trace(MOONCAKE)
    assert m.counts.tolist() == [2, 2, 0, 2]
    assert m.mean_frames[0] == pytest.approx(380) and m.mean_frames[3] == pytest.approx(415)


def test_scale_window_frames_per_token_and_peak_load():
    base = load_trace(MOONCAKE)
    half = load_trace(MOONCAKE, scale=0.5, frames_per_token=2.0)
    assert half.counts.tolist() == [1, 1, 0, 1]
    assert half.mean_frames[0] == pytest.approx(2 * base.mean_frames[0])
    win = load_trace(MOONCAKE, start_s=1, duration_s=3)
    assert win.counts.tolist() == [2, 0, 2]
    cat, fleet = GpuCatalog.default(), {"h200": 8}
    sized = base.with_peak_load(0.25, cat, fleet)
    capacity = 8 * cat.get("h200").capacity.peak_frames_per_s
    assert sized.peak_frames_per_s() == pytest.approx(0.25 * capacity)
    assert sized.counts.sum() / base.counts.sum() == pytest.approx(
        0.25 * capacity / base.peak_frames_per_s())


def test_bad_trace_files_are_one_readable_error(tmp_path):
    cases = [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,10\n", "azure", "missing column"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n", "azure", ":2: malformed"),
        ("Timestamp,Model,Request tokens,Response tokens\n5,x,1,many\n", "burstgpt", ":2: malformed"),
        ('{"timestamp": 0, "output_length": 5}\nnot json\n', "mooncake", ":2: not a Mooncake"),
        ('{"timestamp": 0, "input_length": 3}\n', "mooncake", "output_length"),
        ("Timestamp,Model,Request tokens,Response tokens\n5,x,1,0\n", "burstgpt", "no requests"),
    ]
    for i, (text, fmt, msg) in enumerate(cases):
        p = tmp_path / f"bad{i}.txt"
        p.write_text(text)
        with pytest.raises(UserError, match=msg):
            load_trace(p, fmt)
    with pytest.raises(UserError, match="not found"):
        load_trace(tmp_path / "missing.csv")
    with pytest.raises(UserError, match="choose from"):
        load_trace(AZURE, "parquet")
    with pytest.raises(UserError, match="trace scale must be > 0"):
        load_trace(AZURE, scale=0)
    with pytest.raises(UserError, match="no requests in the window"):
        load_trace(AZURE, start_s=100)


def test_a_public_trace_runs_through_the_simulator_with_warmup():
    cat = GpuCatalog.default()
    fleet = {"h200": 8}
    tr = load_trace(MOONCAKE).window(0, 4)
    tr = type(tr)(np.tile(tr.rate, 150), np.tile(tr.mean_frames, 150), tr.name,
                  np.tile(tr.counts, 150)).with_peak_load(0.2, cat, fleet)  # a 10-minute loop
    sc = Scenario(catalog=cat, fleet=fleet)
    cold = summarize(simulate(sc, tr))
    warm = summarize(simulate(sc, tr, warmup_s=tr.seconds))
    for s in (cold, warm):
        assert s["duration_h"] == pytest.approx(tr.seconds / 3600, abs=0.01)
        assert s["inference"]["requests"] == int(tr.counts.sum())  # exactly the trace's requests
    # the warm-up's fill start-ups are not counted: fewer admissions in the counted part
    assert warm["fill"]["admissions"] < cold["fill"]["admissions"]


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-P", "-m", "ttsfleet.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_simulate_reads_each_format_and_rejects_bad_options(tmp_path):
    for path in (AZURE, BURSTGPT, MOONCAKE):
        p = run("simulate", "--trace", str(path), "--trace-scale", "20", "--fleet", "h200=8",
                "--runs", "policy", "--json", "--no-plot", "--warmup", "4")
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        pol = doc["runs"]["policy (inference + fill)"]
        assert pol["inference"]["requests"] == 20 * int(load_trace(path).counts.sum())
    for args, msg in ((["--trace-format", "parquet"], "choose from"),
                      (["--trace-scale", "-1"], "trace scale must be > 0"),
                      (["--interference", "inference=2"], "less than or equal to 1"),
                      (["--interference", "speed=1"], "must be inference=SHARE")):
        p = run("simulate", "--trace", str(AZURE), "--fleet", "h200=8", "--no-plot", *args)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        err = p.stderr.strip().splitlines()
        assert len(err) == 1 and msg in err[0], (args, p.stderr)

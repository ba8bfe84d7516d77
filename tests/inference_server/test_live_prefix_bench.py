"""``benchmarks/inference_serve/live_prefix.py``'s server figures over the steady sessions: /metrics
read live at the edges of each round's steady window (:class:`SteadyEdges`), beside the whole rounds'."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from ttsfleet.inference import bench_steady
from ttsfleet.inference.bench_steady import Read, span_reading
from ttsfleet.inference.bench_window import Window
from ttsfleet.inference.engine_phases import ENGINE_PHASES
from ttsfleet.inference.synthesis import TTFA_STAGES

from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "inference_serve" / "live_prefix.py"


def _live_prefix():
    return load_script("benchmarks/inference_serve/live_prefix.py")


@pytest.fixture
def reads(monkeypatch):
    """``read_now`` as SteadyEdges calls it, faked: when each read was sent, one fake sample each."""
    sent: list[float] = []

    def fake(url: str) -> Read:
        sent.append(time.perf_counter())
        return Read(sent[-1], [url])

    monkeypatch.setattr(bench_steady, "read_now", fake)
    return sent


def test_the_window_opens_after_the_first_wave_and_the_first_steady_session(reads):
    """The start read waits for both the first wave's first audios and the first later session's
    opening (whichever comes last); the end read for every session's first audio (or end)."""
    edges = _live_prefix().SteadyEdges("u", first_wave=2, sessions=4)
    edges.first_audio(0)
    edges.opened(2)  # session 0 ended, 2 opens: session 1 has no first audio yet
    assert not reads
    edges.first_audio(1)
    assert len(reads) == 1
    edges.opened(3)
    edges.first_audio(2)
    edges.first_audio(2)  # its end, after its first audio: counted once
    assert len(reads) == 1
    edges.first_audio(3)
    window, (start, end) = edges.collect()
    assert [start.at, end.at] == reads and window.start <= start.at and window.end <= end.at


def test_a_round_of_one_wave_has_no_window(reads):
    edges = _live_prefix().SteadyEdges("u", first_wave=3, sessions=3)
    for i in range(3):
        edges.opened(i)
        edges.first_audio(i)
    assert edges.collect() is None and not reads
    assert span_reading([(Window(0.0, 1.0), None)]) is None and span_reading([]) is None


def _run_bench(tmp_path: Path, *flags: str) -> tuple[subprocess.CompletedProcess, float]:
    """The script against a real tiny server on the CPU (reuse side, 2 sessions at a time, short
    sessions in a noise voice): its run and wall time (s)."""
    wav = tmp_path / "voice.wav"
    rng = np.random.default_rng(0)
    sf.write(wav, (0.1 * rng.standard_normal(24000 * 2)).astype("float32"), 24000, subtype="PCM_16")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-P", str(SCRIPT), str(tmp_path / "live"), "--sides", "reuse",
         "--concurrency", "2", "--pause-ms", "50", "--frames", "12",
         "--serve-args", "--max-new-tokens 24", "--reference-wav", str(wav), *flags],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc, time.perf_counter() - started


def _assert_client_lag(report: dict, stdout: str, procs: int) -> None:
    """The client's own lag probes reported for the side, over the steady windows and whole rounds."""
    lag = report["client_thread_lag"]["reuse"]
    for span in ("steady", "whole"):
        s = lag[span]
        assert s["ticks"] > 0 and 0 <= s["p50_ms"] <= s["p99_ms"] <= s["max_ms"], lag
        assert 0 <= s["worst_proc_p99_ms"] <= s["max_ms"], lag
    assert lag["steady"]["ticks"] < lag["whole"]["ticks"]  # the windows are parts of the rounds
    processes = "1 process)" if procs == 1 else f"{procs} processes)"
    assert f"reuse: the bench client's own threads ({processes} woke late by p50 " in stdout


def test_live_prefix_reports_steady_and_whole_round_figures(tmp_path):
    """A real tiny server on the CPU, 2 rounds of 5 sessions 2 at a time: the server counts the
    steady sessions' first audios between each round's reads (6 of 10, none of the first waves'),
    and the steady figures stand beside the whole rounds' (old keys kept)."""
    proc, wall = _run_bench(tmp_path, "--sessions", "5", "--rounds", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "live" / "live_prefix.json").read_text())
    side = report["sides"]["reuse"]
    assert side["n"] == 10 and side["steady_n"] == 6 and side["failed"] == 0
    assert len({r["client_pid"] for r in report["sessions"]["reuse"]}) == 1  # --client-procs 1: this one
    # the listener's underruns: a share of the sessions that played, and the silence they heard
    assert 0 <= side["steady_stalled_share"] <= 1 and side["steady_stall_p99_ms"] >= 0
    assert all(r["stalls"] >= 0 and r["stall_s"] >= 0 for r in report["sessions"]["reuse"])
    assert all(bool(r["stalls"]) == (r["stall_s"] > 0) for r in report["sessions"]["reuse"])
    # where a session first ran dry: present exactly for the sessions that stalled
    assert all((r["first_stall_at_s"] is None) == (r["stalls"] == 0) for r in report["sessions"]["reuse"])
    stalled = [r for r in report["sessions"]["reuse"] if r["stalls"]]
    assert math.isnan(side["first_stall_at_p50_ms"]) == (not stalled)
    for key in ("ttfa_stage_mean_ms", "admission_waits", "codec", "prefill_tokens_reused"):  # older keys
        assert "reuse" in report[key]

    r = report["steady_reads"]["reuse"]
    assert r["read"] and r["whole_requests"] == 10
    # every first wave's first audio precedes its round's start read; a steady session is missed only
    # if its first audio beat its round's last first-wave one (at most one a round, at c=2)
    assert 6 - 2 <= r["requests"] <= 6
    assert 0 < r["seconds"] < wall and 0 <= r["start_lag_ms"] < 250 and 0 <= r["end_lag_ms"] < 250

    means, p99 = report["ttfa_stage_steady_mean_ms"]["reuse"], report["ttfa_stage_steady_p99_ms"]["reuse"]
    whole_means, whole_p99 = report["ttfa_stage_mean_ms"]["reuse"], report["ttfa_stage_p99_ms"]["reuse"]
    # a live session's first audio counts from its first text flush, so it has no HTTP intake stage
    live_stages = [stage for stage in TTFA_STAGES if stage != "intake"]
    assert set(means) == set(whole_means) == set(live_stages)
    assert set(p99) == set(whole_p99) == {*live_stages, "total"}  # the server's whole first audio too
    assert whole_p99["total"] >= max(whole_p99[stage] for stage in live_stages)
    for stage in live_stages:
        for v in (means[stage], p99[stage], whole_p99[stage]):
            assert isinstance(v, float) and math.isfinite(v) and v >= 0
        # the steady sessions are some of the server's: their total time in a stage is part of all of it
        assert means[stage] * r["requests"] <= whole_means[stage] * 10 + 0.1 * 16
    assert p99["prefill"] > 0 and p99["audio"] > 0

    steady_codec, whole_codec = report["codec_steady"]["reuse"], report["codec"]["reuse"]
    assert 0 < steady_codec["pushes"] < whole_codec["pushes"]
    assert steady_codec["frames_per_push"] > 0 and 0 < steady_codec["busy_share"] <= 1
    steady_engine, whole_engine = report["engine_steady"]["reuse"], report["engine"]["reuse"]
    assert steady_engine["steps_per_s"] > 0
    assert set(steady_engine["per_step_ms"]) == set(whole_engine["per_step_ms"]) == set(ENGINE_PHASES)
    assert "reuse: c=2 engine, steady sessions: " in proc.stdout
    waits, whole_waits = report["admission_waits_steady"]["reuse"], report["admission_waits"]["reuse"]
    assert all(0 < n <= whole_waits[cause] for cause, n in waits.items())

    assert "reuse: steady windows read live: " in proc.stdout
    stages = "reuse: time to first audio by stage,"
    assert f"{stages} p99 ms (server, each its own), steady sessions: " in proc.stdout
    assert f"{stages} mean ms (server), whole rounds, first wave included: " in proc.stdout
    assert "busy" in proc.stdout and "of the steady windows" in proc.stdout
    _assert_client_lag(report, proc.stdout, 1)


def test_live_prefix_spreads_a_round_over_client_processes(tmp_path):
    """``--client-procs 2``: one round of 4 sessions at c=2 as one thread in each of two spawned
    processes. The sessions are split between them, the first wave is still the first two, and the
    steady window (its open and first-audio events relayed to this side's SteadyEdges) is still read:
    the server counts the steady sessions' first audios between the reads; each process's lag probe
    is reported."""
    proc, wall = _run_bench(tmp_path, "--sessions", "4", "--rounds", "1", "--client-procs", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "live" / "live_prefix.json").read_text())
    side, rows = report["sides"]["reuse"], report["sessions"]["reuse"]
    assert side["n"] == 4 and side["steady_n"] == 2 and side["failed"] == 0
    assert [r["first_wave"] for r in rows] == [True, True, False, False]
    assert [r["seed"] for r in rows] == [0, 1, 2, 3]  # in index order, each session once
    pids = {r["client_pid"] for r in rows}
    assert len(pids) == 2 and os.getpid() not in pids, pids
    assert len({r["client_pid"] for r in rows if r["first_wave"]}) == 2  # one a process: its share
    r = report["steady_reads"]["reuse"]
    assert r["read"] and r["whole_requests"] == 4 and 1 <= r["requests"] <= 2
    assert 0 < r["seconds"] < wall
    _assert_client_lag(report, proc.stdout, 2)


@pytest.mark.parametrize("procs", ["0", "3"])
def test_client_procs_out_of_range_is_a_usage_error(procs):
    """No processes, or more than the sessions open at once (one would idle): refused before any
    server starts, as one argparse error line."""
    proc = subprocess.run([sys.executable, "-P", str(SCRIPT), "/nonexistent/out", "--concurrency", "2",
                           "--client-procs", procs], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert f"error: --client-procs {procs}: from 1 to --concurrency (2)" in proc.stderr.splitlines()[-1]


def test_the_concurrency_is_split_evenly_over_client_processes():
    shares = _live_prefix().shares
    assert shares(64, 4) == [16] * 4 and shares(5, 2) == [3, 2] and shares(2, 2) == [1, 1]
    assert sum(shares(7, 3)) == 7 and max(shares(7, 3)) - min(shares(7, 3)) == 1

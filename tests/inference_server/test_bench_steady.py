"""``bench serve``'s server figures over a level's steady window: /metrics read live at its edges."""

from __future__ import annotations

import asyncio
import json

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from ttsfleet.inference.bench import BenchConfig, _run_read
from ttsfleet.inference.bench_steady import Counts, view_of
from ttsfleet.inference.bench_window import steady_window
from ttsfleet.inference.synthesis import TTFA_STAGES

from ttsfleet.metrics import LATENCY_BUCKETS, spec

from .test_bench_cli import _cli


def test_steady_reads_are_taken_live_at_the_windows_edges(server):
    """One run of 2 clients x 3 requests: the reads are sent right after the edges the samples give
    (not after the run), and the server counts between them the first audios that fell inside."""
    cfg = BenchConfig(url=server.url, levels=[2], max_new_tokens=10, api_key=server.api_key,
                      frames_spread=0.5)
    samples, wall, reads = asyncio.run(_run_read(cfg, 2, 6))
    assert all(s.ok for s in samples) and reads is not None
    w = steady_window(samples)
    assert w is not None
    start, end = reads
    assert 0 <= start.at - w.start < 0.25 and 0 <= end.at - w.end < 0.25
    counts = Counts.between(start.samples, end.samples, end.at - start.at)
    view = view_of(counts)
    inside = [s for s in samples if start.at < s.start_s + s.ttfa_s < end.at]
    assert 0 < view.requests <= 6 - 2  # the first wave's first audios came before the start read
    assert abs(view.requests - len(inside)) <= 1  # a first audio in flight while a read is served
    assert set(view.stage_means_ms) == set(TTFA_STAGES) and view.stage_p99_ms["prefill"] > 0
    assert view.codec["pushes"] >= 1 and 0 < view.codec["busy_share"] <= 1
    # the engine loop over the window: its steps, their batch and each step's interval by phase
    assert view.engine["steps_per_s"] > 0 and 1 <= view.engine["mean_batch"] <= 2
    assert set(view.engine["per_step_ms"]) == {"gpu_wait", "launch", "prefill", "other"}
    assert abs(view.engine["step_ms"] - sum(view.engine["per_step_ms"].values())) < 0.01  # rounding only


def test_bench_serve_reports_steady_and_whole_level_figures(server, tmp_path):
    """c=2 with 2 requests per client has a steady window; c=4 with 1 per client has none: its
    steady figures are left out and the table says so. The whole level's keep their old keys."""
    out = tmp_path / "bench"
    proc = _cli("bench", "serve", "--url", server.url, "--concurrency", "2,4", "--requests", "4",
                "--max-new-tokens", "10", "--api-key", server.api_key, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "bench.json").read_text())
    for key in ("ttfa_stages_ms", "ttfa_stages_p99_ms", "codec"):  # what older reports carry
        assert [st["concurrency"] for st in report[key]] == [2, 4]
    for key in ("ttfa_stages_steady_ms", "ttfa_stages_steady_p99_ms", "codec_steady"):
        assert [st["concurrency"] for st in report[key]] == [2]
    assert set(report["ttfa_stages_steady_ms"][0]) - {"concurrency"} == set(TTFA_STAGES)
    two, four = report["steady_reads"]
    assert two["read"] and not four["read"] and two["level_requests"] == four["level_requests"] == 4
    assert 0 < two["requests"] <= 2 and two["seconds"] > 0 and 0 <= two["start_lag_ms"] < 250
    assert "c=2 server time to first audio by stage, p99 ms (each its own), steady window: " in proc.stdout
    assert ("c=2 server time to first audio by stage, mean ms, whole level, first wave included: "
            in proc.stdout)
    assert "c=4 no steady window" in proc.stdout
    assert [e["concurrency"] for e in report["engine"]] == [2, 4]
    assert [e["concurrency"] for e in report["engine_steady"]] == [2]
    assert "c=2 engine, steady window: " in proc.stdout and " ms a step: gpu_wait " in proc.stdout
    assert "c=4 server time to first audio by stage, mean ms, steady window" not in proc.stdout


def _samples(reg: CollectorRegistry) -> list:
    text = generate_latest(reg).decode()
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def test_counts_of_two_windows_add_up():
    """Two runs' windows summed: the means and p99 are those of the requests inside either window,
    nothing observed outside them (a real prometheus_client histogram, the server's name and buckets)."""
    reg = CollectorRegistry()
    h = Histogram(spec("inference_ttfa_stage_seconds").name, "stages", ["model", "stage"],
                  buckets=LATENCY_BUCKETS, registry=reg)
    reads, total = [], Counts()
    for outside, inside in ((1.5, 0.010), (2.5, 0.030)):
        for _ in range(20):  # a first wave, before the window
            h.labels("tiny", "queue").observe(outside)
        reads.append(_samples(reg))
        for _ in range(10):
            h.labels("tiny", "queue").observe(inside)
        total = total.plus(Counts.between(reads[-1], _samples(reg), 2.0))
    view = view_of(total)
    assert view.requests == 20 and view.seconds == 4.0
    assert view.stage_means_ms == {"queue": 20.0}
    assert 25 < view.stage_p99_ms["queue"] <= 50

"""``ttsfleet bench serve`` against the running tiny server, and the serve CLI's bad-input exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib.image as mpimg
import pytest


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TTSFLEET_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "ttsfleet.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def test_bench_serve_writes_table_json_png(server, tmp_path):
    out = tmp_path / "bench"
    proc = _cli("bench", "serve", "--url", server.url, "--concurrency", "1,4", "--requests", "4",
                "--max-new-tokens", "12", "--api-key", server.api_key, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "frames/s" in proc.stdout and "scaling" in proc.stdout
    report = json.loads((out / "bench.json").read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 4]
    for lv in report["levels"]:
        assert lv["errors"] == 0 and lv["requests"] == 4
        assert lv["frames_per_s"] > 0 and lv["per_request_frames_per_s"] > 0
        assert 0 < lv["ttfa_p50_s"] <= lv["ttfa_p99_s"]
        assert 0 <= lv["stalled_share"] <= 1 and lv["stall_p99_s"] >= 0  # pcm: the listener was played
    assert "c=4 listener underruns" in proc.stdout
    for lv in report["levels"]:  # the client timed its own event loop through the level
        lag = lv["client_loop_lag"]
        assert lag["ticks"] > 0 and 0 <= lag["p50_ms"] <= lag["p99_ms"] <= lag["max_ms"]
    assert "c=4 the bench client's own event loop, late by p50" in proc.stdout
    for use in report["engine"]:  # and the server timed its own loop through the level
        assert use["loop_lag_ticks"] > 0 and use["loop_lag_mean_ms"] >= 0
    assert "the server's event loop late by mean" in proc.stdout
    for lv in report["levels"]:  # the client froze its heap and timed its own garbage collections
        pauses = lv["client_gc"]
        assert pauses["frozen"] > 10_000 and set(pauses) == {"gen0", "gen1", "gen2", "frozen"}
        assert all(pauses[g]["count"] >= 0 and pauses[g]["total_ms"] >= 0 for g in ("gen0", "gen1", "gen2"))
    assert "objects frozen" in proc.stdout
    for lv in report["levels"]:  # the wait for the response headers: a part of the first audio's
        assert 0 < lv["headers_p50_s"] <= lv["headers_p99_s"] <= lv["ttfa_p99_s"]
        # the server said its app's part (Server-Timing), so the rest is outside it: less than the wait
        assert 0 <= lv["outside_p50_s"] <= lv["outside_p99_s"] <= lv["headers_p99_s"]
        # of it the client's own part (pooled connections after the first wave), and the slowest requests
        assert 0 < lv["sent_p50_s"] <= lv["sent_p99_s"] and lv["new_connections"] <= lv["concurrency"]
        slowest = lv["slowest_headers"]
        assert slowest and slowest[0]["headers_ms"] == max(r["headers_ms"] for r in slowest)
        assert slowest[0]["headers_ms"] >= lv["headers_p99_s"] * 1000 - 0.1  # the longest is past the p99
    assert "c=4 the client's wait for the response headers, timed requests: p50" in proc.stdout
    assert "; outside the server's app p50 " in proc.stdout
    for use in report["engine"]:  # and the server's full collections over each level, 0 or more
        assert use["gc2_count"] >= 0 and use["gc2_total_ms"] >= 0
    assert "its full garbage collections" in proc.stdout
    assert report["scaling"] > 0
    assert report["server"]["build"]["model"] == "tiny"
    # the server's own split of time to first audio, per level (its requests only)
    from ttsfleet.inference.synthesis import TTFA_STAGES

    stages = report["ttfa_stages_ms"]
    assert [st["concurrency"] for st in stages] == [1, 4]
    for st in stages:
        assert set(st) - {"concurrency"} == set(TTFA_STAGES) and st["prefill"] > 0 and st["decode"] > 0
    assert "c=4 server time to first audio by stage" in proc.stdout
    # each stage's p99 over the level, from the server's histogram buckets
    p99 = report["ttfa_stages_p99_ms"]
    assert [st["concurrency"] for st in p99] == [1, 4]
    for tail in p99:
        assert set(tail) - {"concurrency"} == {*TTFA_STAGES, "total"} and tail["prefill"] > 0
        # the server's whole time to first audio beside them: no stage's tail is longer than it
        assert tail["total"] >= max(tail[stage] for stage in TTFA_STAGES)
    assert "c=4 server time to first audio by stage, p99 ms" in proc.stdout
    # the codec's work per level: every push decodes a frame or more, and it is busy part of the time
    codec = report["codec"]
    assert [u["concurrency"] for u in codec] == [1, 4]
    for u in codec:
        assert u["pushes"] >= 1 and u["frames_per_push"] >= 1 and 0 < u["busy_share"] <= 1
    assert "c=4 codec: " in proc.stdout and "frames per push" in proc.stdout
    # points load as a measured capacity curve
    from ttsfleet.catalog import GpuCatalog

    cat = GpuCatalog.default().with_measured_file("h200", out / "bench.json")
    assert cat.get("h200").capacity.max_concurrency == 4
    img = mpimg.imread(out / "bench.png")
    assert img.shape[0] > 100 and img.shape[1] > 100


def test_bench_serve_steady_closed_loop_then_open_loop(server, tmp_path):
    """3 requests per client leave a steady window; an open-loop level sends Poisson arrivals."""
    out = tmp_path / "bench"
    proc = _cli("bench", "serve", "--url", server.url, "--concurrency", "2", "--per-client", "3",
                "--rate", "3", "--duration-s", "2", "--max-new-tokens", "8", "--frames-spread", "0.5",
                "--api-key", server.api_key, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "bench.json").read_text())
    (lv,) = report["levels"]
    assert lv["requests"] == 6 and lv["errors"] == 0 and lv["method"] == "steady"
    assert 0 < lv["steady_window_s"] < lv["wall_s"] and lv["steady_requests"] >= 1
    assert lv["first_wave_ttfa_p50_s"] > 0 and lv["whole_run_frames_per_s"] > 0
    assert report["points"][0]["method"] == "steady"
    assert set(report["capacity"]) >= {"concurrency", "rtf_p99_max", "ttfa_p99_max_s"}
    from ttsfleet.catalog import GpuCatalog

    curve = GpuCatalog.default().with_measured_file("h200", out / "bench.json").get("h200").capacity
    assert curve.slo_concurrency == report["capacity"]["concurrency"]
    (ol,) = report["open_loop"]
    assert ol["arrival_rate_per_s"] == 3.0 and ol["requests"] == 6 and ol["errors"] == 0
    assert ol["method"] == "whole-run" and ol["in_flight_mean"] > 0 and ol["frames_per_s"] > 0


@pytest.mark.parametrize("args, env, needle", [
    (["serve", "--port", "70000"], {}, "port"),
    (["serve", "--gpu-class", "tpu9"], {}, "unknown GPU class"),
    (["serve", "--quantization", "int3"], {}, "quantization"),
    (["serve", "--prefill-chunk-tokens", "-5"], {}, "prefill_chunk_tokens"),
    (["serve", "--checkpoint", "/does/not/exist"], {}, "checkpoint"),
    (["serve"], {"TTSFLEET_MAX_RUNNING_REQUESTS": "lots"}, "TTSFLEET_MAX_RUNNING_REQUESTS"),
    (["serve", "--codec-compile", "fast"], {}, "--codec-compile"),
    (["serve"], {"TTSFLEET_CODEC_COMPILE": "reduce-overhead"}, "TTSFLEET_CODEC_COMPILE"),
    (["serve"], {"TTSFLEET_GC_FREEZE": "maybe"}, "error: TTSFLEET_GC_FREEZE: 'maybe' is not one of 1, true"),
    (["bench", "engine", "--codec-compile", "max-autotune"], {}, "--codec-compile"),
    (["bench", "engine", "--gil-switch-ms", "-1"], {}, "--gil-switch-ms"),
    (["bench", "engine", "--codec-process", "--mps", "always"], {}, "not auto, on, off"),
    (["bench", "serve", "--concurrency", "a,b"], {}, "--concurrency"),
    (["bench", "serve", "--rate", "fast"], {}, "--rate"),
    (["bench", "serve", "--rate", "-1"], {}, "--rate"),
    (["bench", "serve", "--per-client", "0"], {}, "--per-client"),
    (["bench", "serve", "--connections", "pooled"], {}, "--connections 'pooled' is not own or shared"),
    (["bench", "serve", "--url", "http://127.0.0.1:9", "--concurrency", "1"], {}, "cannot reach"),
])
def test_cli_bad_input_exits_2(args, env, needle):
    proc = _cli(*args, env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stderr
    assert "Traceback" not in proc.stderr

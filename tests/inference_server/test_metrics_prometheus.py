"""/healthz, /readyz and /metrics; a real Prometheus scrapes the server and sees the contract's series."""

from __future__ import annotations

import shutil
import subprocess
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ttsfleet.metrics import CONTRACT_LIST, spec

INFERENCE = [m for m in CONTRACT_LIST if m.component == "inference"]


def _scrape(client) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(client.get("/metrics").text):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_probes(client):
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/v1/health").status_code == 200
    ready = client.get("/readyz")
    assert ready.status_code == 200 and ready.json()["ready"] is True


def test_metrics_follow_the_contract(client):
    before = _scrape(client)
    frames_name = spec("inference_frames").exposed_names[0]
    f0 = sum(s.value for s in before.get(frames_name, []))
    resp = client.post("/v1/tts", json={"text": "metrics please", "format": "pcm", "max_new_tokens": 12,
                                        "seed": 21})
    assert resp.status_code == 200
    client.post("/v1/tts", json={"text": ""})  # one 400
    after = _scrape(client)
    names = set(after)
    for m in INFERENCE:
        if m.type in ("counter", "histogram") and m.labels:
            continue  # labelled series appear once observed; checked below
        assert set(m.exposed_names) & names, f"{m.name} missing from /metrics"
    for short in ("inference_ttfa_seconds", "inference_request_duration_seconds", "inference_realtime_factor",
                  "inference_batch_size"):
        assert set(spec(short).exposed_names) <= names, short
    frames = sum(s.value for s in after[frames_name]) - f0
    fps = float(resp.headers["x-frames-per-second"])
    audio_frames = len(resp.content) / 2 / int(resp.headers["x-sample-rate"]) * fps
    assert frames >= round(audio_frames) >= 1  # other tests may run too, never fewer
    statuses = {s.labels["status"] for s in after[spec("inference_requests").exposed_names[0]]}
    assert {"200", "400"} <= statuses
    slots = after[spec("inference_kv_slots_total").name][0].value
    assert slots == 8
    assert after[spec("inference_ready").name][0].value == 1
    info = after[spec("inference_build").exposed_names[0]][0].labels
    assert info["cuda_graph_max_bs"] == "8" and info["model"] == "tiny"


def test_the_servers_garbage_collections_are_timed_by_generation(client):
    """Every collection of the server process from before its load on: the start-up freeze (on by
    default) is a full pass of its own, so generation 2 has counted one at least; each generation's
    series is there from the start."""
    series = _scrape(client)[spec("inference_gc_pause_seconds").name + "_count"]
    counts = {s.labels["generation"]: s.value for s in series}
    assert set(counts) == {"0", "1", "2"} and counts["2"] >= 1, counts
    sums = {s.labels["generation"]: s.value for s in _scrape(client)[spec("inference_gc_pause_seconds").name
                                                                      + "_sum"]}
    assert sums["2"] > 0


def test_the_heap_is_frozen_after_the_warm_up_unless_asked_not_to(server_factory):
    """The freeze is logged once the warm-up generation is done (its objects among the frozen);
    --no-gc-freeze skips it."""
    import re

    frozen = server_factory("--log-level", "info")
    plain = server_factory("--log-level", "info", "--no-gc-freeze")
    log = frozen.log_path.read_text()
    found = re.search(r"froze (\d+) objects in (\d+) ms", log)
    assert found and int(found[1]) > 10_000, log[-2000:]
    assert log.index("warm-up generation took") < found.start()
    plain_log = plain.log_path.read_text()
    assert "warm-up generation took" in plain_log and "froze" not in plain_log


def test_prefilled_prompt_tokens_are_counted(client):
    """One request's prompt, every token of it, on ``inference_prefill_tokens`` (the workload's
    prompt length, which the served benchmark's --preset-text changes 4x)."""
    from ttsfleet.inference.model_config import preset
    from ttsfleet.inference.prompt import build_prompt
    from ttsfleet.inference.tokenizer import load_tokenizer

    name = spec("inference_prefill_tokens").exposed_names[0]
    t0 = sum(s.value for s in _scrape(client).get(name, []))
    text = "count my prompt tokens"
    resp = client.post("/v1/tts", json={"text": text, "format": "pcm", "max_new_tokens": 4, "seed": 3})
    assert resp.status_code == 200
    grown = sum(s.value for s in _scrape(client)[name]) - t0
    assert grown == build_prompt(load_tokenizer("tiny"), preset("tiny"), text).shape[-1]


def codec_counts(client) -> tuple[float, float, float]:
    """The server's codec pushes, frames and busy seconds on /metrics (0 before the first push)."""
    scrape = _scrape(client)
    names = ("inference_codec_pushes", "inference_codec_frames", "inference_codec_busy_seconds")
    pushes, frames, busy = (sum(s.value for s in scrape.get(spec(n).exposed_names[0], [])) for n in names)
    return pushes, frames, busy


def audio_frames(resp) -> int:
    """Frames of audio in a PCM response."""
    samples = len(resp.content) / 2
    return round(samples / int(resp.headers["x-sample-rate"]) * float(resp.headers["x-frames-per-second"]))


def test_the_codec_threads_work_reaches_metrics(client):
    """Codec thread: a request's audio frames were all decoded by the codec, in at least one push and
    at most one push a frame, and it spent time doing so (other tests may add, never subtract)."""
    p0, f0, b0 = codec_counts(client)
    resp = client.post("/v1/tts", json={"text": "codec counters", "format": "pcm", "max_new_tokens": 12,
                                        "seed": 8})
    assert resp.status_code == 200
    p1, f1, b1 = codec_counts(client)
    assert f1 - f0 >= audio_frames(resp) >= 1
    assert 1 <= p1 - p0 <= f1 - f0
    assert b1 > b0


def _wait_query(base: str, query: str, pred, timeout: float = 40.0) -> list:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{base}/api/v1/query", params={"query": query}, timeout=5).json()
            last = r
            if r.get("status") == "success" and pred(r["data"]["result"]):
                return r["data"]["result"]
        except (httpx.HTTPError, ValueError):  # not listening yet, or a starting server's non-JSON answer
            pass
        time.sleep(0.5)
    raise AssertionError(f"prometheus query {query!r} never matched; last answer {last}")


@pytest.mark.prometheus
@pytest.mark.skipif(shutil.which("prometheus") is None, reason="needs the prometheus binary")
def test_real_prometheus_scrapes_server(server, client, tmp_path, port_picker):
    port = port_picker()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: ttsfleet-inference\n    scrape_interval: 1s\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{server.port}']\n")
    with open(tmp_path / "prometheus.log", "wb") as log:
        argv = ["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}"]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for i in range(3):
            body = {"text": f"scrape me {i}", "format": "pcm", "max_new_tokens": 8, "seed": i}
            assert client.post("/v1/tts", json=body).status_code == 200
        up = _wait_query(base, 'up{job="ttsfleet-inference"}', lambda r: r and r[0]["value"][1] == "1")
        assert up[0]["metric"]["instance"] == f"127.0.0.1:{server.port}"
        ok = spec("inference_requests").exposed_names[0]
        reqs = _wait_query(base, f'sum({ok}{{status="200"}})', lambda r: r and float(r[0]["value"][1]) >= 3)
        assert float(reqs[0]["value"][1]) >= 3
        slots = _wait_query(base, spec("inference_kv_slots_total").name, lambda r: bool(r))
        assert float(slots[0]["value"][1]) == 8
        ttfa = spec("inference_ttfa_seconds").name
        hist = _wait_query(base, f"sum({ttfa}_count)", lambda r: r and float(r[0]["value"][1]) >= 3)
        assert float(hist[0]["value"][1]) >= 3
        for short in ("inference_requests_in_flight", "inference_queue_depth", "inference_running_batch_size",
                      "inference_kv_slots_used", "inference_ready"):
            assert _wait_query(base, spec(short).name, lambda r: bool(r)), short
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_ttfa_stages_add_up_to_time_to_first_audio(client):
    """Every stage is observed for a streamed request, and per request the stages sum to its time to
    first audio (so the sums of both histograms grow by the same amount)."""
    from ttsfleet.inference.synthesis import TTFA_STAGES

    def sums(scrape: dict[str, list]) -> tuple[float, dict[str, float]]:
        ttfa = sum(s.value for s in scrape.get(spec("inference_ttfa_seconds").name + "_sum", []))
        stage_sums = scrape.get(spec("inference_ttfa_stage_seconds").name + "_sum", [])
        stages = {s.labels["stage"]: s.value for s in stage_sums}
        return ttfa, stages

    t0, st0 = sums(_scrape(client))
    with client.stream("POST", "/v1/tts", json={"text": "stages of the first audio", "format": "pcm",
                                                "max_new_tokens": 10, "seed": 3, "streaming": True}) as r:
        assert r.status_code == 200
        b"".join(r.iter_bytes())
    t1, st1 = sums(_scrape(client))
    assert set(st1) == set(TTFA_STAGES)
    grown = {k: st1[k] - st0.get(k, 0.0) for k in TTFA_STAGES}
    assert all(v >= 0 for v in grown.values())
    assert grown["prefill"] > 0 and grown["decode"] > 0 and grown["intake"] > 0
    assert sum(grown.values()) == pytest.approx(t1 - t0, rel=1e-6, abs=1e-6)


def test_a_slow_body_counts_in_the_intake_stage_and_the_whole(client):
    """Time to first audio starts when the app receives the request, not at the handler's mark: a body
    that takes 0.4 s to arrive shows up in ``intake`` and in the whole."""
    import json
    import time

    def stages() -> dict[str, float]:
        rows = _scrape(client).get(spec("inference_ttfa_stage_seconds").name + "_sum", [])
        return {s.labels["stage"]: s.value for s in rows}

    def slow_body():
        body = json.dumps({"text": "a slow body", "format": "pcm", "max_new_tokens": 4, "seed": 5,
                           "streaming": True}).encode()
        yield body[:10]
        time.sleep(0.4)
        yield body[10:]

    before = stages()
    with client.stream("POST", "/v1/tts", content=slow_body(),
                       headers={"content-type": "application/json"}) as r:
        assert r.status_code == 200
        b"".join(r.iter_bytes())
    grown = stages()["intake"] - before.get("intake", 0.0)
    assert 0.35 <= grown < 5.0
    # and the response said the app's part before its headers (W3C Server-Timing), the slow body in it
    from ttsfleet.inference.bench import server_timing

    assert 0.35 <= server_timing(r.headers["server-timing"], "app") < 5.0


@pytest.mark.parametrize(("header", "want"), [
    ("app;dur=12.5", 0.0125), ('db;dur=3, app;desc="x";dur="7"', 0.007), ("app", float("nan")),
    ("app;dur=oops", float("nan")), ("", float("nan")), ("apps;dur=1", float("nan"))])
def test_server_timing_is_read_by_name(header, want):
    import math

    from ttsfleet.inference.bench import server_timing

    got = server_timing(header, "app")
    assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want)


def test_ttfa_stages_skip_a_missing_mark_and_still_add_up():
    import types

    from ttsfleet.inference.synthesis import ttfa_stages

    h = types.SimpleNamespace(submitted_at=1.0, ingested_at=1.1, admitted_at=None, prefilled_at=1.5,
                              first_codes_at=1.6)
    got = ttfa_stages(0.9, h, 2.0)
    assert list(got) == ["arrival", "inbox", "prefill", "decode", "audio"]
    assert got["inbox"] == pytest.approx(0.1) and got["prefill"] == pytest.approx(0.4)
    assert sum(got.values()) == pytest.approx(1.1)
    assert ttfa_stages(0.9, None, 2.0) == {}
    # with the app's receipt stamped: the intake before the handler's mark leads, and the whole grows by it
    got = ttfa_stages(0.9, h, 2.0, received=0.6)
    assert list(got) == ["intake", "arrival", "inbox", "prefill", "decode", "audio"]
    assert got["intake"] == pytest.approx(0.3) and sum(got.values()) == pytest.approx(1.4)


def test_requests_beyond_the_slots_count_as_waits_for_slots(server):
    """Twelve requests at once on eight slots: iterations leave some waiting for a slot, and the
    bench's reader of ``inference_admission_waits`` sees them (what splits the queue stage)."""
    import asyncio

    from ttsfleet.inference.bench import readings_of, server_samples

    _, before = readings_of(server_samples(server.url))

    async def burst() -> list[int]:
        async with server.async_client() as c:
            body = {"text": "waiting for a slot", "format": "pcm", "max_new_tokens": 24, "seed": 3}
            got = await asyncio.gather(*(c.post("/v1/tts", json=body) for _ in range(12)))
        return [r.status_code for r in got]

    assert asyncio.run(burst()) == [200] * 12
    _, after = readings_of(server_samples(server.url))
    assert after.get("slots", 0) > before.get("slots", 0)
    assert set(after) <= {"slots", "budget", "batch", "hold"}

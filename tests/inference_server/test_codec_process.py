"""The codec in a child process (``EngineConfig.codec_process``), on the tiny model and codec (CPU):
the same audio as the codec thread, the child's counters forwarded, a dead child fails the open
requests instead of hanging them, and a cancel reaches the child."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
from ttsfleet.inference.codec_process import CodecSource
from ttsfleet.inference.engine import Engine, EngineConfig, EngineStopped, GenerationRequest
from ttsfleet.inference.prompt import build_prompt
from ttsfleet.inference.sampling import SamplingParams

from ttsfleet.metrics import spec

from .conftest import metric_value

SEEDS = [3, 4, 5]


def _config(source: CodecSource | None, gather_ms: float = 0.0) -> EngineConfig:
    return EngineConfig(max_running_requests=4, max_queue=8, cuda_graph_max_bs=4, cpu_threads=1,
                        codec_process=source, codec_gather_ms=gather_ms)


async def _collect(eng: Engine, prompt, seed: int, max_new: int = 12, cancel_after: int = 0,
                   long: bool = False):
    """Codes, audio and the final event of one request (``cancel_after``: cancel at that audio event;
    ``long``: decode through end-of-speech to the context's end — hundreds of steps on the tiny
    model — so a cancel or a kill always lands mid-stream)."""
    req = GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=seed),
                            max_new_tokens=10**6 if long else max_new, first_chunk_frames=1, chunk_frames=4,
                            ignore_eos=long)
    h = eng.submit(req, asyncio.get_running_loop())
    codes, audio = [], []
    while True:
        ev = await asyncio.wait_for(h.next(), timeout=60)
        if ev.kind != "audio":
            return codes, audio, ev
        codes.append(ev.codes)
        audio.append(ev.audio)
        if cancel_after and len(codes) == cancel_after:
            eng.cancel(h)


def _prompt(parts):
    """The one prompt every test here serves (the cancel test bounds its stream by this length)."""
    model, _, tok = parts
    return build_prompt(tok, model.config, "Codec process test.")


def _serve(parts, source: CodecSource | None, seeds: list[int], gather_ms: float = 0.0, **kw):
    model, codec, _ = parts
    prompt = _prompt(parts)
    eng = Engine(model, codec, _config(source, gather_ms), None, "tiny")
    eng.start()

    async def main():
        return await asyncio.gather(*(_collect(eng, prompt, s, **kw) for s in seeds))

    try:
        return eng, asyncio.run(main())
    finally:
        eng.stop()


def test_the_child_finds_its_cuda_ordinal_with_or_without_an_index():
    from ttsfleet.inference.codec_process import cuda_index

    assert cuda_index("cuda") == 0 and cuda_index("cuda:3") == 3
    with pytest.raises(ValueError, match="not a CUDA device"):
        cuda_index("cpu")


def test_the_codec_process_decodes_what_the_codec_thread_does(parts):
    _, in_thread = _serve(parts, None, SEEDS)
    eng, in_child = _serve(parts, CodecSource("tiny", "cpu"), SEEDS)
    frames = 0
    for (codes_a, audio_a, end_a), (codes_b, audio_b, end_b) in zip(in_thread, in_child, strict=True):
        assert end_a.kind == end_b.kind == "done" and end_a.frames == end_b.frames
        np.testing.assert_array_equal(np.concatenate(codes_a, axis=1), np.concatenate(codes_b, axis=1))
        # which streams share a batched codec call depends on timing in either place, and a batch's
        # float sums differ in the last bits (1e-5 at a peak of ~0.35): equal to well under 1e-4
        np.testing.assert_allclose(np.concatenate(audio_b), np.concatenate(audio_a), rtol=0, atol=1e-4)
        frames += end_b.frames
    # the child's counters reached the engine's stats (the bench's codec busy figure reads them)
    assert eng.stats.codec_frames == frames and 0 < eng.stats.codec_calls < frames
    assert eng.stats.codec_s > 0 and 0 < eng.stats.codec_rounds <= eng.stats.codec_calls
    assert not eng._codec_proc.alive  # stopped with the engine, and a stop is not a death
    assert eng._dead is None


def test_the_codec_process_gathering_chunks_decodes_the_same_audio(parts):
    """``codec_gather_ms`` in the child: its loop sleeps until held codes fall due (no new codes need
    come: the last chunks of the last streams must still be decoded) and the audio is unchanged."""
    _, in_thread = _serve(parts, None, SEEDS)
    _, gathered = _serve(parts, CodecSource("tiny", "cpu"), SEEDS, gather_ms=30.0)
    for (_, audio_a, end_a), (_, audio_b, end_b) in zip(in_thread, gathered, strict=True):
        assert end_a.kind == end_b.kind == "done" and end_a.frames == end_b.frames
        np.testing.assert_allclose(np.concatenate(audio_b), np.concatenate(audio_a), rtol=0, atol=1e-4)


def test_a_cancel_reaches_the_child_and_ends_the_stream(parts):
    """The stream ends as cancelled, short of what it would have decoded uncancelled (the context's
    room after the prompt). How far short depends on how far the engine ran ahead of the codec before
    the cancel landed: on a loaded 2-core CI machine 287 frames of audio came before the end
    (2026-12-07), past the half-context bound this test had."""
    prompt_len = _prompt(parts).shape[1]
    eng, out = _serve(parts, CodecSource("tiny", "cpu"), [7], long=True, cancel_after=1)
    codes, _, end = out[0]
    assert end.kind == "done" and end.reason == "cancelled"
    assert sum(c.shape[1] for c in codes) < eng.max_seq_len - prompt_len


def test_a_codec_process_that_cannot_start_fails_requests_with_a_reason(parts, tmp_path):
    model, codec, _ = parts
    eng = Engine(model, codec, _config(CodecSource(str(tmp_path / "missing"), "cpu")), None, "tiny")
    eng.start()
    prompt = _prompt(parts)

    async def main():
        return await _collect(eng, prompt, 1)

    try:
        _, _, end = asyncio.run(main())
        assert end.kind == "error" and "codec process failed to start" in end.reason
        assert "does not exist" in end.reason
        deadline = time.monotonic() + 30
        while eng.alive and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not eng.alive
        with pytest.raises(EngineStopped):
            eng.submit(GenerationRequest(prompt=prompt, sampling=SamplingParams(seed=1), max_new_tokens=4),
                       asyncio.new_event_loop())
    finally:
        eng.stop()


def test_a_killed_codec_process_fails_the_open_requests(parts):
    model, codec, _ = parts
    eng = Engine(model, codec, _config(CodecSource("tiny", "cpu")), None, "tiny")
    eng.start()
    prompt = _prompt(parts)
    assert eng._codec_proc.ready.wait(60)

    async def main():
        task = asyncio.ensure_future(_collect(eng, prompt, 2, long=True))
        await asyncio.sleep(0.2)
        eng._codec_proc._proc.kill()
        return await task

    try:
        _, _, end = asyncio.run(main())
        assert end.kind == "error" and "codec process exited" in end.reason
        assert not eng.alive
    finally:
        eng.stop()


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def test_a_server_with_the_codec_process_speaks_as_the_one_without(server, client, server_factory,
                                                                   tmp_path):
    """Through the real HTTP server, switched on by the contract's environment variable: a child
    process exists and the audio is the shared (codec-thread) server's for the same seed."""
    other = server_factory("--max-running-requests", "8", "--max-queue", "32", "--max-text-chars", "250",
                           "--references-dir", str(tmp_path), "--prefill-chunk-tokens", "32",
                           env={"TTSFLEET_CODEC_PROCESS": "1"})
    assert _children(other.proc.pid), "no codec process under the server"
    assert not _children(server.proc.pid)  # the codec thread's server has none
    body = {"text": "Hello there, this is a test.", "max_new_tokens": 24, "seed": 5, "format": "pcm"}
    with other.client(auth=False) as mine:
        got = mine.post("/v1/tts", json=body)
    want = client.post("/v1/tts", json=body)
    assert got.status_code == want.status_code == 200, got.text
    x, y = np.frombuffer(got.content, "<i2").astype(int), np.frombuffer(want.content, "<i2").astype(int)
    assert x.size == y.size > 0 and int(np.abs(x - y).max()) <= 2
    # the child's counts reach the server's /metrics: exactly this request's frames (the warm-up's are
    # not traffic), in at least one push and at most one a frame, with codec time spent
    with other.client(auth=False) as mine:
        names = ("inference_codec_pushes", "inference_codec_frames", "inference_codec_busy_seconds")
        pushes, frames, busy = (metric_value(mine, spec(n).exposed_names[0]) for n in names)
    fps, rate = float(got.headers["x-frames-per-second"]), int(got.headers["x-sample-rate"])
    assert frames == round(x.size / rate * fps) >= 1
    assert 1 <= pushes <= frames and busy > 0

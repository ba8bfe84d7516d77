"""POST /v1/tts and /v1/audio/speech return real, decodable audio in every format, whole or streamed."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import time

import msgpack
import numpy as np
import pytest
import soundfile as sf


def _tts(client, **body):
    body.setdefault("text", "Hello there, this is a test.")
    body.setdefault("max_new_tokens", 40)
    body.setdefault("seed", 7)
    return client.post("/v1/tts", json=body)


def _same_pcm(a: bytes, b: bytes) -> bool:
    """Equal up to 1-2 LSB: the streaming codec matches a one-shot decode to ~1e-5, chunking varies."""
    x, y = np.frombuffer(a, "<i2").astype(int), np.frombuffer(b, "<i2").astype(int)
    return x.size == y.size and x.size > 0 and int(np.abs(x - y).max()) <= 2


def _frames(resp, samples: int) -> float:
    fps = float(resp.headers["x-frames-per-second"])
    return samples / int(resp.headers["x-sample-rate"]) * fps


@pytest.mark.parametrize("fmt, rate", [("wav", 44100), ("mp3", 44100), ("opus", 48000)])
def test_formats_decode(client, fmt, rate):
    resp = _tts(client, format=fmt)
    assert resp.status_code == 200, resp.text
    audio, sr = sf.read(io.BytesIO(resp.content), dtype="float32")
    assert sr == rate
    assert audio.ndim == 1 and audio.size > 0
    assert np.isfinite(audio).all()
    assert resp.headers["content-type"].startswith({"wav": "audio/wav", "mp3": "audio/mpeg",
                                                    "opus": "audio/ogg"}[fmt])
    # compressed codecs pad a little; the length still says how many frames were decoded
    assert 0 < _frames(resp, audio.size) <= 40 + 3


def test_pcm_is_raw_int16_with_whole_frames(client):
    resp = _tts(client, format="pcm")
    assert resp.status_code == 200
    pcm = np.frombuffer(resp.content, dtype="<i2")
    frames = _frames(resp, pcm.size)
    assert 1 <= frames <= 40
    assert abs(frames - round(frames)) < 1e-6  # the codec emits whole frames
    assert np.abs(pcm).max() > 0


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs ffmpeg")
def test_mp3_decodes_with_ffmpeg(client):
    resp = _tts(client, format="mp3", mp3_bitrate=64)
    proc = subprocess.run(["ffmpeg", "-hide_banner", "-loglevel", "error", "-i", "pipe:0", "-f", "s16le",
                           "-ac", "1", "pipe:1"], input=resp.content, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout) > 1000


def test_sample_rate_is_honoured(client):
    resp = _tts(client, format="wav", sample_rate=16000)
    audio, sr = sf.read(io.BytesIO(resp.content))
    assert sr == 16000
    frames = _frames(resp, audio.size)
    assert 0 < frames <= 41


def test_same_seed_same_audio_and_streaming_matches(client):
    a = _tts(client, format="pcm", seed=123)
    b = _tts(client, format="pcm", seed=123)
    c = _tts(client, format="pcm", seed=124)
    assert _same_pcm(a.content, b.content)
    assert a.content != c.content
    with client.stream("POST", "/v1/tts", json={"text": "Hello there, this is a test.", "max_new_tokens": 40,
                                                 "seed": 123, "format": "pcm", "streaming": True}) as resp:
        assert resp.status_code == 200
        assert resp.headers.get("transfer-encoding") == "chunked"
        chunks = [c for c in resp.iter_bytes() if c]
    assert _same_pcm(b"".join(chunks), a.content)


def test_streaming_wav_arrives_in_chunks_and_decodes(client):
    body = {"text": "A longer sentence so that several chunks are streamed out.", "max_new_tokens": 60,
            "seed": 3, "format": "wav", "streaming": True, "latency": "low"}
    with client.stream("POST", "/v1/tts", json=body) as resp:
        assert resp.status_code == 200
        chunks = [c for c in resp.iter_raw() if c]
    data = b"".join(chunks)
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 44100 and audio.size > 0
    if audio.size > 2048 * 4:  # long enough to span several chunks at latency=low
        assert len(chunks) > 1


def test_msgpack_body_and_model_header(client):
    body = msgpack.packb({"text": "Msgpack works too.", "format": "wav", "max_new_tokens": 20, "seed": 1})
    resp = client.post("/v1/tts", content=body, headers={"content-type": "application/msgpack",
                                                         "model": "s2.1-pro"})
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-model"] == "tiny"
    audio, sr = sf.read(io.BytesIO(resp.content))
    assert sr == 44100 and audio.size > 0


def test_long_text_is_split_into_chunks(client):
    text = " ".join(f"Sentence number {i} is here." for i in range(8))  # > 100 chars
    resp = client.post("/v1/tts", json={"text": text, "chunk_length": 100, "format": "pcm",
                                        "max_new_tokens": 10, "seed": 5})
    assert resp.status_code == 200, resp.text
    frames = _frames(resp, np.frombuffer(resp.content, "<i2").size)
    # each of the >= 3 segments contributes up to 10 frames; several segments must have run
    assert frames > 0
    assert frames <= 10 * 4


def test_prosody_volume_scales_audio(client):
    loud = _tts(client, format="pcm", seed=9)
    quiet = _tts(client, format="pcm", seed=9, prosody={"volume": -20})
    a = np.frombuffer(loud.content, "<i2").astype(np.float64)
    b = np.frombuffer(quiet.content, "<i2").astype(np.float64)
    assert a.size == b.size
    ratio = np.sqrt((b ** 2).mean() / (a ** 2).mean())
    assert 0.08 < ratio < 0.12


def test_openai_speech(client):
    resp = client.post("/v1/audio/speech", json={"input": "OpenAI style.", "voice": "alloy",
                                                 "response_format": "wav", "max_new_tokens": 20, "seed": 2})
    assert resp.status_code == 200, resp.text
    audio, sr = sf.read(io.BytesIO(resp.content))
    assert sr == 24000 and audio.size > 0  # OpenAI answers every format at 24 kHz


def test_openai_speech_sse_stream(client):
    body = {"input": "Streaming events.", "response_format": "pcm", "stream": True, "stream_format": "sse",
            "max_new_tokens": 20, "seed": 2}
    with client.stream("POST", "/v1/audio/speech", json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    assert len(pcm) > 0 and len(pcm) % 2 == 0


def test_client_disconnect_frees_the_slot(server, client):
    from ttsfleet.metrics import spec

    used = spec("inference_kv_slots_used").name
    with client.stream("POST", "/v1/tts", json={"text": "I will hang up early.", "format": "pcm", "seed": 8,
                                                "max_new_tokens": 400, "streaming": True,
                                                "latency": "low"}) as resp:
        assert resp.status_code == 200
        first = next(c for c in resp.iter_bytes() if c)
        assert first
    # the handler cancels the request; the engine frees its slot at the next step
    deadline = time.monotonic() + 20
    while True:
        lines = [ln for ln in client.get("/metrics").text.splitlines() if ln.startswith(used + "{")]
        if lines and float(lines[0].split()[-1]) == 0:
            break
        assert time.monotonic() < deadline, lines
        time.sleep(0.1)
    # counted as a client disconnect (nginx's 499), not as a success or a server error
    reqs = spec("inference_requests").exposed_names[0]
    assert f'{reqs}{{model="tiny",status="499"}}' in client.get("/metrics").text


def test_sampling_parameters_reach_the_sampler(client):
    greedy = [_tts(client, format="pcm", top_k=1, seed=s, max_new_tokens=12).content for s in (1, 2)]
    cold = [_tts(client, format="pcm", temperature=0, seed=s, max_new_tokens=12).content for s in (1, 2)]
    sampled = [_tts(client, format="pcm", seed=s, max_new_tokens=12).content for s in (1, 2)]
    assert _same_pcm(*greedy)  # greedy decoding does not depend on the seed
    assert _same_pcm(*cold) and _same_pcm(greedy[0], cold[0])
    assert sampled[0] != sampled[1]

"""The official OpenAI SDK (``openai``) against ``ttsfleet serve``: ``audio.speech.create`` in every
format at OpenAI's 24 kHz, ``with_streaming_response`` receiving audio while the model still decodes,
and ``stream_format="sse"`` as OpenAI's event stream.
"""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import soundfile as sf

from .conftest import API_KEY, speech_wav

openai = pytest.importorskip("openai")

TEXT = "Hello from the OpenAI SDK."
SEEDED = {"extra_body": {"seed": 5}}


@pytest.fixture(scope="module")
def oai(sdk_server):
    return openai.OpenAI(api_key=API_KEY, base_url=f"{sdk_server.url}/v1")


def _speech(oai, **kw):
    kw.setdefault("model", "tts-1")
    kw.setdefault("voice", "alloy")
    kw.setdefault("input", TEXT)
    return oai.audio.speech.create(**kw)


def test_default_call_is_24khz_mp3(oai):
    audio, sr = sf.read(io.BytesIO(_speech(oai).content), dtype="float32")
    assert sr == 24000 and audio.size > 0 and np.isfinite(audio).all()


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_format_is_24khz(oai, fmt):
    import shutil

    if fmt == "aac" and shutil.which("ffmpeg") is None:
        pytest.skip("aac needs ffmpeg")
    if fmt in ("aac", "mp3", "flac") and shutil.which("ffprobe") is None:
        pytest.skip(f"reading {fmt}'s header needs ffprobe (ffmpeg)")
    data = _speech(oai, response_format=fmt, **SEEDED).content
    assert data
    if fmt in ("aac", "mp3", "flac"):  # streamed: flac's header says "length unknown", as the format allows
        import subprocess

        out = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=sample_rate,channels", "-of",
                              "json", "pipe:0"], input=data, capture_output=True, timeout=60)
        stream = json.loads(out.stdout)["streams"][0]
        assert int(stream["sample_rate"]) == 24000 and stream["channels"] == 1
    elif fmt != "pcm":
        audio, sr = sf.read(io.BytesIO(data))
        assert sr == 24000 and audio.size > 0


def test_pcm_is_24khz_int16_mono(oai, sdk_server):
    """OpenAI's pcm: the same samples as the wav, and as Fish's pcm asked for at 24 kHz."""
    pcm = _speech(oai, response_format="pcm", **SEEDED).content
    wav, sr = sf.read(io.BytesIO(_speech(oai, response_format="wav", **SEEDED).content), dtype="int16")
    assert sr == 24000
    assert np.array_equal(np.frombuffer(pcm, "<i2"), wav)
    with sdk_server.client() as c:
        fish = c.post("/v1/tts", json={"text": TEXT, "format": "pcm", "sample_rate": 24000, "seed": 5})
    a, b = np.frombuffer(pcm, "<i2").astype(int), np.frombuffer(fish.content, "<i2").astype(int)
    assert a.size == b.size and int(np.abs(a - b).max()) <= 2  # streamed vs whole: codec chunking ~1 LSB


def test_streaming_response_arrives_while_decoding(oai, sdk_server):
    # several text segments (over 300 characters each cut), seeded: the decode outlasts the first chunk
    text = " ".join(f"Sentence {i} of a longer input, so the model is still decoding when audio arrives."
                    for i in range(12))
    chunks, in_flight_at_first = [], None
    streaming = oai.audio.speech.with_streaming_response
    with streaming.create(model="tts-1", voice="alloy", input=text, response_format="pcm",
                          extra_body={"seed": 3}) as resp:
        assert resp.headers.get("transfer-encoding") == "chunked"
        for chunk in resp.iter_bytes():
            if not chunks:
                in_flight_at_first = httpx.get(f"{sdk_server.url}/readyz").json()["in_flight"]
            chunks.append(chunk)
    assert in_flight_at_first is not None and in_flight_at_first >= 1  # first bytes before the end
    assert len(chunks) > 1 and sum(map(len, chunks)) % 2 == 0


def test_sse_events_as_openai_documents(oai):
    with oai.audio.speech.with_streaming_response.create(model="gpt-4o-mini-tts", voice="alloy", input=TEXT,
                                                         response_format="pcm", stream_format="sse") as resp:
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data: "):]) for line in resp.iter_lines() if line.startswith("data: ")]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    assert set(done["usage"]) == {"input_tokens", "output_tokens", "total_tokens"}
    assert done["usage"]["total_tokens"] == done["usage"]["input_tokens"] + done["usage"]["output_tokens"] > 0
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert len(pcm) > 0 and len(pcm) % 2 == 0


def test_speed_range_is_openais(oai):
    normal = _speech(oai, response_format="pcm", **SEEDED).content
    for speed, ratio in ((0.25, 4.0), (4.0, 0.25)):
        changed = _speech(oai, response_format="pcm", speed=speed, **SEEDED).content
        assert abs(len(changed) / len(normal) - ratio) < 0.05 * ratio, (speed, len(changed), len(normal))
    with pytest.raises(openai.BadRequestError):
        _speech(oai, speed=4.5)


def test_custom_voice_object(oai, sdk_server):
    with sdk_server.client() as c:
        audio = base64.b64encode(speech_wav("An OpenAI custom voice.")).decode()
        added = c.post("/v1/references/add", json={"id": "voice_1234", "text": "An OpenAI custom voice.",
                                                    "audio": audio})
    assert added.status_code == 200, added.text
    greedy = {"extra_body": {"temperature": 0.0}}
    plain = _speech(oai, response_format="pcm", **greedy).content
    custom = _speech(oai, response_format="pcm", voice={"id": "voice_1234"}, **greedy).content
    assert custom and custom != plain
    with pytest.raises(openai.BadRequestError):  # OpenAI answers an unknown voice with 400
        _speech(oai, voice={"id": "voice_nobody"})


def test_input_limit_and_bad_key(oai, sdk_server):
    with pytest.raises(openai.BadRequestError) as err:
        _speech(oai, input="x" * 4097)
    assert "4096" in str(err.value)
    bad = openai.OpenAI(api_key="wrong", base_url=f"{sdk_server.url}/v1", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        _speech(bad)


def test_overload_is_rate_limit_error(server_factory):
    """Beyond its queue the server answers 429 + Retry-After; the SDK raises RateLimitError (here
    without its own retries, which would honour Retry-After)."""
    import asyncio

    srv = server_factory("--max-running-requests", "1", "--max-queue", "1", "--max-new-tokens", "48",
                         api_key=API_KEY)

    async def flood():
        client = openai.AsyncOpenAI(api_key=API_KEY, base_url=f"{srv.url}/v1", max_retries=0)
        calls = [client.audio.speech.create(model="tts-1", voice="alloy", input=f"{TEXT} {i}",
                                            response_format="pcm") for i in range(6)]
        return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(flood())
    limited = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert limited and all(r.response.headers["retry-after"] == "1" for r in limited), results
    assert any(not isinstance(r, Exception) for r in results), results

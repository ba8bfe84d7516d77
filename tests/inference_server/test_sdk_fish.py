"""The official Fish Audio SDK (``fish-audio-sdk``: the ``fishaudio`` client and the legacy
``fish_audio_sdk.Session``) against ``ttsfleet serve``, on the SDK's defaults.

The SDK sends msgpack with its own defaults (``opus_bitrate: 32`` in kbps, ``chunk_length: 200``,
``latency: "balanced"``, ``max_new_tokens: 1024``); every call here passes only what a user would.
"""

from __future__ import annotations

import asyncio
import io

import httpx
import numpy as np
import pytest
import soundfile as sf

from .conftest import API_KEY, speech_wav

fishaudio = pytest.importorskip("fishaudio")
legacy = pytest.importorskip("fish_audio_sdk")

TEXT = "Hello from the Fish Audio SDK."


@pytest.fixture(scope="module")
def fish(sdk_server):
    with fishaudio.FishAudio(api_key=API_KEY, base_url=sdk_server.url) as client:
        yield client


def _decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768, 44100
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    return audio, sr


def test_convert_on_defaults_is_mp3(fish):
    audio, sr = _decode(fish.tts.convert(text=TEXT), "mp3")
    assert sr == 44100 and audio.ndim == 1 and audio.size > 2048
    assert np.isfinite(audio).all() and np.abs(audio).max() > 0


@pytest.mark.parametrize("fmt, rate", [("wav", 44100), ("pcm", 44100), ("mp3", 44100), ("opus", 48000)])
def test_every_format(fish, fmt, rate):
    data = fish.tts.convert(text=TEXT, format=fmt)
    audio, sr = _decode(data, fmt)
    assert sr == rate and audio.size > 0
    if fmt == "pcm":
        assert len(data) % 4096 == 0  # whole 2048-sample codec frames of int16


def test_stream_yields_chunks_that_decode(fish):
    chunks = list(fish.tts.stream(text=TEXT, format="wav"))
    assert chunks and all(chunks)
    audio, sr = sf.read(io.BytesIO(b"".join(chunks)))
    assert sr == 44100 and audio.size > 0


def test_async_client(sdk_server):
    async def run() -> bytes:
        async with fishaudio.AsyncFishAudio(api_key=API_KEY, base_url=sdk_server.url) as client:
            return await client.tts.convert(text=TEXT, format="wav")

    audio, sr = sf.read(io.BytesIO(asyncio.run(run())))
    assert sr == 44100 and audio.size > 0


def test_reference_id_and_zero_shot_cloning(fish, sdk_server):
    voice = speech_wav("My voice sounds like this.")
    # upstream fish-speech's multipart form: id, audio file, text
    with sdk_server.client() as c:
        added = c.post("/v1/references/add", files={"audio": ("voice.wav", voice, "audio/wav")},
                       data={"id": "fish sdk voice", "text": "My voice sounds like this."})
    assert added.status_code == 200, added.text
    cfg = fishaudio.TTSConfig(format="pcm", temperature=0.0, top_p=0.7)  # greedy: only the voice differs
    plain = fish.tts.convert(text=TEXT, config=cfg)
    by_id = fish.tts.convert(text=TEXT, reference_id="fish sdk voice", config=cfg)
    inline = fishaudio.ReferenceAudio(audio=voice, text="My voice sounds like this.")
    cloned = fish.tts.convert(text=TEXT, config=cfg, references=[inline])
    assert plain and by_id and cloned
    assert by_id != plain and cloned != plain  # the reference conditions the prompt
    assert by_id == cloned  # stored and inline forms of the same voice are the same prompt


def test_bad_key_is_authentication_error(sdk_server):
    with fishaudio.FishAudio(api_key="wrong-key", base_url=sdk_server.url) as client, \
            pytest.raises(fishaudio.AuthenticationError) as err:
        client.tts.convert(text=TEXT)
    assert err.value.status == 401 and "API key" in err.value.message


def test_unknown_voice_is_not_found(fish):
    with pytest.raises(fishaudio.NotFoundError) as err:
        fish.tts.convert(text=TEXT, reference_id="nobody-has-this-voice")
    assert err.value.status == 404


@pytest.fixture(scope="module")
def one_slot_server(server_factory):
    """One decode slot and one queue place: the third concurrent request is refused."""
    return server_factory("--max-running-requests", "1", "--max-queue", "1", "--max-new-tokens", "48",
                          api_key=API_KEY)


def test_overload_is_rate_limit_error(one_slot_server):
    async def run():
        async with fishaudio.AsyncFishAudio(api_key=API_KEY, base_url=one_slot_server.url) as client:
            calls = [client.tts.convert(text=f"{TEXT} Number {i}.", format="pcm") for i in range(6)]
            return await asyncio.gather(*calls, return_exceptions=True)

    results = asyncio.run(run())
    limited = [r for r in results if isinstance(r, fishaudio.RateLimitError)]
    served = [r for r in results if isinstance(r, bytes)]
    assert limited and served and len(limited) + len(served) == len(results), results
    assert all(r.status == 429 for r in limited)


def test_legacy_session_formats(sdk_server):
    session = legacy.Session(API_KEY, base_url=sdk_server.url)
    for fmt in ("mp3", "wav", "pcm"):
        data = b"".join(session.tts(legacy.TTSRequest(text=TEXT, format=fmt)))
        audio, _ = _decode(data, fmt)
        assert audio.size > 0, fmt


def test_legacy_session_cloning(sdk_server):
    voice = speech_wav("Legacy voice sample.")
    session = legacy.Session(API_KEY, base_url=sdk_server.url)
    req = legacy.TTSRequest(text=TEXT, format="wav",
                            references=[legacy.ReferenceAudio(audio=voice, text="Legacy voice sample.")])
    audio, sr = sf.read(io.BytesIO(b"".join(session.tts(req))))
    assert sr == 44100 and audio.size > 0


def test_legacy_session_errors(sdk_server, one_slot_server):
    with pytest.raises(legacy.exceptions.HttpCodeErr) as err:
        list(legacy.Session("wrong-key", base_url=sdk_server.url).tts(legacy.TTSRequest(text=TEXT)))
    assert err.value.status == 401

    async def flood():
        session = legacy.Session(API_KEY, base_url=one_slot_server.url)

        async def one(i: int):
            return b"".join([c async for c in session.tts.awaitable(legacy.TTSRequest(text=f"{TEXT} {i}"))])

        return await asyncio.gather(*(one(i) for i in range(6)), return_exceptions=True)

    results = asyncio.run(flood())
    assert any(isinstance(r, legacy.exceptions.HttpCodeErr) and r.status == 429 for r in results), results
    assert any(isinstance(r, bytes) and r for r in results), results


def test_upstream_documented_json_example(sdk_server):
    """Fish's API reference curl example (fish_tts_api.json), byte for byte but the voice id."""
    body = {"text": "Hello! Welcome to Fish Audio.", "temperature": 0.7, "top_p": 0.7,
            "prosody": {"speed": 1, "volume": 0, "normalize_loudness": True}, "chunk_length": 300,
            "normalize": True, "format": "mp3", "sample_rate": 44100, "mp3_bitrate": 128, "latency": "normal",
            "max_new_tokens": 1024, "repetition_penalty": 1.2, "min_chunk_length": 50,
            "condition_on_previous_chunks": True, "early_stop_threshold": 1}
    resp = httpx.post(f"{sdk_server.url}/v1/tts", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {API_KEY}", "model": "s2.1-pro-free"})
    assert resp.status_code == 200, resp.text
    audio, sr = sf.read(io.BytesIO(resp.content))
    assert sr == 44100 and audio.size > 0


def test_voice_cloning_through_the_voices_api(fish):
    """``voices.create`` (instant cloning) gives an id ``tts.convert`` takes; list, get, update, delete."""
    words = "A voice made through the voices API."
    voice = fish.voices.create(title="SDK clone", voices=[speech_wav(words)], texts=[words], tags=["test"])
    assert voice.title == "SDK clone" and voice.state == "trained" and voice.tags == ["test"]
    cfg = fishaudio.TTSConfig(format="pcm", temperature=0.0)
    cloned = fish.tts.convert(text=TEXT, reference_id=voice.id, config=cfg)
    assert cloned and cloned != fish.tts.convert(text=TEXT, config=cfg)
    assert voice.id in {v.id for v in fish.voices.list(page_size=100).items}
    fish.voices.update(voice.id, title="Renamed clone", visibility="public")
    again = fish.voices.get(voice.id)
    assert again.title == "Renamed clone" and again.visibility == "public"
    fish.voices.delete(voice.id)
    with pytest.raises(fishaudio.NotFoundError):
        fish.voices.get(voice.id)
    with pytest.raises(fishaudio.APIError) as err:
        fish.voices.create(title="no audio", voices=[b"not audio at all"])
    assert err.value.status == 400

"""``/v1/tts/live``, Fish Audio's live protocol, driven by the official fish-audio-sdk WebSocket clients
(``fishaudio.TTSClient.stream_websocket`` and the legacy ``WebSocketSession``) and, for the error
cases the SDK cannot produce, by raw msgpack events over ``httpx_ws``.
"""

from __future__ import annotations

import io
import threading

import httpx
import msgpack
import numpy as np
import pytest
import soundfile as sf

from ttsfleet.metrics import spec

from .conftest import API_KEY, metric_value

fishaudio = pytest.importorskip("fishaudio")
legacy = pytest.importorskip("fish_audio_sdk")
httpx_ws = pytest.importorskip("httpx_ws")


@pytest.fixture(scope="module")
def fish(sdk_server):
    with fishaudio.FishAudio(api_key=API_KEY, base_url=sdk_server.url) as client:
        yield client


def test_audio_streams_out_while_text_streams_in(fish, sdk_server):
    """The text generator waits for the first audio before it sends the rest: only a server that
    speaks the first sentence before the stream ends lets it go on."""
    first_audio = threading.Event()
    waited: list[bool] = []

    def text():
        yield "Hello there, this is the first sentence of a live conversation. "
        waited.append(first_audio.wait(60))
        yield "And this is "
        yield "the rest of it!"

    with sdk_server.client() as c:
        ok_before = metric_value(c, spec("inference_requests").exposed_names[0], status="200")
        ttfa_before = metric_value(c, spec("inference_ttfa_seconds").name + "_count")
    chunks = []
    for chunk in fish.tts.stream_websocket(text(), format="wav"):
        chunks.append(chunk)
        first_audio.set()
    assert waited == [True]  # audio arrived while the client still held back text
    audio, sr = sf.read(io.BytesIO(b"".join(chunks)), dtype="float32")
    assert sr == 44100 and audio.size > 2 * 2048 and np.isfinite(audio).all()
    assert len(chunks) > 1 and max(map(len, chunks)) <= 16 * 1024
    with sdk_server.client() as c:
        assert metric_value(c, spec("inference_requests").exposed_names[0], status="200") == ok_before + 1
        assert metric_value(c, spec("inference_ttfa_seconds").name + "_count") == ttfa_before + 1


def test_defaults_and_flush_events(fish):
    """SDK defaults (mp3, balanced latency); FlushEvent cuts a segment mid-sentence."""
    stream = ["One short phrase", fishaudio.FlushEvent(), " and another after the flush."]
    data = b"".join(fish.tts.stream_websocket(iter(stream)))
    audio, sr = sf.read(io.BytesIO(data), dtype="float32")
    assert sr == 44100 and audio.size > 0


def test_pcm_and_speed(fish):
    normal = b"".join(fish.tts.stream_websocket(iter(["Say it."]), format="pcm",
                                                config=fishaudio.TTSConfig(temperature=0.0)))
    fast = b"".join(fish.tts.stream_websocket(iter(["Say it."]), format="pcm", speed=2.0,
                                              config=fishaudio.TTSConfig(temperature=0.0)))
    assert len(normal) % 2 == 0 and len(normal) > 0
    assert abs(len(fast) / len(normal) - 0.5) < 0.05


def test_legacy_websocket_session(sdk_server):
    with legacy.WebSocketSession(API_KEY, base_url=sdk_server.url) as ws:
        texts = iter(["Legacy live. ", "It works."])
        data = b"".join(ws.tts(legacy.TTSRequest(text="", format="wav"), texts))
    audio, sr = sf.read(io.BytesIO(data))
    assert sr == 44100 and audio.size > 0


def test_bad_key_refuses_the_handshake(sdk_server):
    with fishaudio.FishAudio(api_key="wrong", base_url=sdk_server.url) as client, \
            pytest.raises(httpx_ws.WebSocketUpgradeError) as err:
        list(client.tts.stream_websocket(iter(["hi"])))
    assert err.value.response.status_code == 401  # the handshake answer is the JSON 401


def _raw_session(sdk_server, *events: dict) -> list[dict]:
    """Send raw msgpack events; return every event the server sent until it finished or closed."""
    got: list[dict] = []
    with httpx.Client(base_url=sdk_server.url, headers={"Authorization": f"Bearer {API_KEY}"}) as c, \
            httpx_ws.connect_ws("/v1/tts/live", c) as ws:
        for ev in events:
            ws.send_bytes(msgpack.packb(ev))
        try:
            while True:
                msg = msgpack.unpackb(ws.receive_bytes(timeout=60))
                got.append(msg)
                if msg["event"] == "finish":
                    break
        except httpx_ws.WebSocketDisconnect:
            pass
    return got


@pytest.mark.parametrize("events, words", [
    ([{"event": "text", "text": "no start first"}], "first event"),
    ([{"event": "start", "request": {"text": "", "format": "ogg"}}], "format"),
    ([{"event": "start", "request": {"text": "", "reference_id": "nobody"}}], "not found"),
])
def test_bad_sessions_finish_with_error(sdk_server, events, words):
    got = _raw_session(sdk_server, *events)
    assert got[-1]["event"] == "finish" and got[-1]["reason"] == "error", got
    assert words in got[-1]["message"]


def test_raw_protocol_text_then_stop(sdk_server):
    got = _raw_session(sdk_server, {"event": "start", "request": {"text": "", "format": "pcm", "seed": 1}},
                       {"event": "text", "text": "Raw events work."}, {"event": "stop"})
    assert got[-1] == {"event": "finish", "reason": "stop"}
    pcm = b"".join(e["audio"] for e in got if e["event"] == "audio")
    assert len(pcm) > 0 and len(pcm) % 2 == 0


def test_sigterm_lets_an_open_session_finish(server_factory):
    """A drain waits for live sessions, not only for segments in the engine: text sent after SIGTERM
    is still spoken, the session ends with ``finish: stop``, and the server then exits 0."""
    import signal

    srv = server_factory("--max-new-tokens", "32", api_key=API_KEY)
    first_audio, terminated = threading.Event(), threading.Event()

    def text():
        yield "The first sentence, long enough to be spoken at once, arrives before the shutdown. "
        if not first_audio.wait(60):
            return  # the session ends without the signal; the test fails below, it does not hang
        srv.proc.send_signal(signal.SIGTERM)
        terminated.set()
        yield "And this one after it, while the server drains."

    chunks = []
    with fishaudio.FishAudio(api_key=API_KEY, base_url=srv.url) as client:
        for chunk in client.tts.stream_websocket(text(), format="wav"):
            chunks.append(chunk)
            first_audio.set()
    assert terminated.is_set()
    audio, sr = sf.read(io.BytesIO(b"".join(chunks)), dtype="float32")
    assert sr == 44100 and audio.size > 0
    assert srv.proc.wait(timeout=30) == 0


def test_a_short_sentence_is_spoken_once_the_client_pauses(fish):
    """Below ``min_chunk_length`` a finished sentence waits for more text, but not forever."""
    first_audio = threading.Event()
    waited: list[bool] = []

    def text():
        yield "Hi there!"
        waited.append(first_audio.wait(60))
        yield " Bye."

    for _ in fish.tts.stream_websocket(text(), format="pcm"):
        first_audio.set()
    assert waited == [True]


def test_text_buffer_cuts():
    from ttsfleet.inference.routes_live import TextBuffer

    buf = TextBuffer(chunk_length=100, min_chunk_length=20)
    assert buf.add("Short. ") == [] and buf.has_sentence
    assert buf.add("Now the sentence is long enough. And") == ["Short. Now the sentence is long enough. "]
    assert buf.text == "And" and not buf.has_sentence
    assert buf.finished_sentences() == [] and buf.flush() == ["And"] and buf.text == ""
    assert buf.add("word " * 30) == ["word " * 20]  # no sentence end: cut at the last space in reach
    assert buf.add("Done!") == []  # 55 characters, nothing after the "!" yet
    assert buf.finished_sentences() == ["word " * 10 + "Done!"] and buf.text == ""

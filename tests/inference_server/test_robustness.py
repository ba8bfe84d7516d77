"""Inputs that used to end in a 500, a reset connection or dishonest metrics: each is now a 4xx JSON
error counted in ``/metrics``, the connection stays usable, a vanished client stops its decode, and
``in_flight`` never counts requests that are refused. Plus the upstream compatibility gaps.
"""

from __future__ import annotations

import asyncio
import base64
import socket
import time

import httpx
import msgpack
import pytest

from ttsfleet.metrics import spec

from .conftest import metric_value, speech_wav

REQS = spec("inference_requests").exposed_names[0]
ERRS = spec("inference_errors").exposed_names[0]

NESTED = b'{"text":"hi","prosody":' + b"[" * 5000 + b"]" * 5000 + b"}"
SURROGATE = b'{"text":"\\ud800 hello"}'


@pytest.mark.parametrize("body", [NESTED, SURROGATE], ids=["deeply-nested", "lone-surrogate"])
def test_hostile_json_is_a_counted_400_and_the_connection_lives(client, body):
    before = metric_value(client, REQS, status="400")
    errors = metric_value(client, ERRS, reason="malformed_body")
    resp = client.post("/v1/tts", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["reason"] == "malformed_body", resp.text
    ok = client.post("/v1/tts", json={"text": "still fine", "format": "pcm", "max_new_tokens": 4, "seed": 1})
    assert ok.status_code == 200  # same keep-alive client, same connection pool
    assert metric_value(client, REQS, status="400") == before + 1
    assert metric_value(client, ERRS, reason="malformed_body") == errors + 1


def test_hostile_json_keeps_the_same_connection(server):
    """The 400 leaves the keep-alive connection open: the next request travels on the same socket."""
    import http.client
    import json

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"}
    try:
        conn.request("POST", "/v1/tts", body=NESTED, headers=headers)
        first = conn.getresponse()
        assert first.status == 400 and json.loads(first.read())["reason"] == "malformed_body"
        assert (first.getheader("connection") or "").lower() != "close"
        sock = conn.sock
        ok = json.dumps({"text": "same socket", "format": "pcm", "max_new_tokens": 4, "seed": 1})
        conn.request("POST", "/v1/tts", body=ok, headers=headers)
        second = conn.getresponse()
        assert second.status == 200 and second.read()
        assert conn.sock is sock and sock is not None
    finally:
        conn.close()


def test_valid_surrogate_pair_is_text(client):
    body = b'{"text":"\\ud83d\\ude00 smile","format":"pcm","max_new_tokens":4}'
    resp = client.post("/v1/tts", content=body, headers={"content-type": "application/json"})
    assert resp.status_code == 200, resp.text


def test_non_streaming_disconnect_cancels_decoding(server, client):
    """A whole-file request whose client hangs up stops decoding and is counted 499."""
    text = " ".join(f"This is sentence number {i} of a long text." for i in range(5))
    body = httpx.Request("POST", "/v1/tts", json={"text": text, "format": "pcm", "chunk_length": 100,
                                                    "seed": 1}).content
    gone_before = metric_value(client, REQS, status="499")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = (f"POST /v1/tts HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Authorization: Bearer {server.api_key}\r\nContent-Length: {len(body)}\r\n\r\n")
        sock.sendall(head.encode() + body)
        deadline = time.monotonic() + 30
        while metric_value(client, spec("inference_kv_slots_used").name) < 1:  # decoding has started
            assert time.monotonic() < deadline
            time.sleep(0.05)
    deadline = time.monotonic() + 20
    while metric_value(client, REQS, status="499") < gone_before + 1:
        assert time.monotonic() < deadline, "disconnect never counted"
        time.sleep(0.1)
    while metric_value(client, spec("inference_kv_slots_used").name) > 0:  # freed at the next step
        assert time.monotonic() < deadline, "the slot was never freed"
        time.sleep(0.05)
    frames = metric_value(client, spec("inference_frames").exposed_names[0])
    time.sleep(1.0)
    assert metric_value(client, spec("inference_frames").exposed_names[0]) == frames  # nothing decodes on


@pytest.fixture(scope="module")
def tight_server(server_factory):
    return server_factory("--max-running-requests", "2", "--max-queue", "2", "--max-new-tokens", "48")


def test_in_flight_never_counts_refused_requests(tight_server):
    """Under a burst of 16, in_flight stays within the 2 slots + 2 queue places the engine admits."""
    seen: list[int] = []

    async def scenario():
        async with tight_server.async_client() as c:
            stop = asyncio.Event()

            async def watch():
                while not stop.is_set():
                    seen.append((await c.get("/readyz")).json()["in_flight"])

            watcher = asyncio.create_task(watch())
            bodies = [{"text": f"Burst request {i}.", "format": "pcm", "seed": i} for i in range(16)]
            answers = await asyncio.gather(*(c.post("/v1/tts", json=b) for b in bodies))
            codes = [r.status_code for r in answers]
            stop.set()
            await watcher
            return codes

    codes = asyncio.run(scenario())
    assert codes.count(429) >= 1 and set(codes) <= {200, 429}, codes
    assert max(seen) <= 4, max(seen)
    with tight_server.client() as c:
        assert metric_value(c, spec("inference_requests_in_flight").name) == 0


def test_multipart_reference_upload_and_msgpack_replies(client):
    voice = speech_wav("A form upload.")
    form = {"id": "form voice", "text": "A form upload."}
    resp = client.post("/v1/references/add?format=msgpack", data=form, files={"audio": ("voice.wav", voice)})
    assert resp.status_code == 200 and resp.headers["content-type"] == "application/msgpack"
    assert msgpack.unpackb(resp.content) == {"success": True, "message": "reference 'form voice' added",
                                             "reference_id": "form voice"}
    listed = client.get("/v1/references/list", headers={"accept": "application/msgpack"})
    assert "form voice" in msgpack.unpackb(listed.content)["reference_ids"]
    renamed = client.post("/v1/references/update", json={"old_reference_id": "form voice",
                                                         "new_reference_id": "form-voice-2"})
    assert renamed.json()["old_reference_id"] == "form voice"
    assert renamed.json()["new_reference_id"] == "form-voice-2"
    deleted = client.request("DELETE", "/v1/references/delete",
                             content=msgpack.packb({"reference_id": "form-voice-2"}),
                             headers={"content-type": "application/msgpack", "accept": "application/msgpack"})
    assert msgpack.unpackb(deleted.content)["success"] is True
    bad = client.post("/v1/references/add", files={"id": (None, "no-audio"), "text": (None, "x")})
    assert bad.status_code == 400 and bad.json()["reason"] == "invalid_request"


def test_upstream_ranges(client):
    for body in ({"chunk_length": 1000}, {"max_new_tokens": 0}, {"opus_bitrate": 32, "format": "opus"},
                 {"opus_bitrate": 32000, "format": "opus"}, {"format": "flac"}):
        resp = client.post("/v1/tts", json={"text": "Upstream ranges.", "seed": 2, **body,
                                            "max_new_tokens": body.get("max_new_tokens", 6)})
        assert resp.status_code == 200, (body, resp.text)


def test_openapi_documents_both_request_bodies(client):
    doc = client.get("/openapi.json").json()
    for path, model in (("/v1/tts", "TTSRequest"), ("/v1/audio/speech", "SpeechRequest")):
        content = doc["paths"][path]["post"]["requestBody"]["content"]
        assert {"application/json", "application/msgpack"} <= set(content)
        assert content["application/json"]["schema"]["$ref"] == f"#/components/schemas/{model}"
    schemas = doc["components"]["schemas"]
    assert schemas["TTSRequest"]["properties"]["chunk_length"]["maximum"] == 1000
    assert 32 in schemas["TTSRequest"]["properties"]["opus_bitrate"]["enum"]
    speed = schemas["SpeechRequest"]["properties"]["speed"]
    assert (speed["minimum"], speed["maximum"]) == (0.25, 4.0)
    assert "multipart/form-data" in doc["paths"]["/v1/references/add"]["post"]["requestBody"]["content"]


def test_reference_audio_as_base64_json(client):
    resp = client.post("/v1/tts", json={"text": "Zero shot in JSON.", "format": "pcm", "max_new_tokens": 6,
                                        "references": [{"audio": base64.b64encode(speech_wav()).decode(),
                                                        "text": "This is a reference voice."}]})
    assert resp.status_code == 200, resp.text

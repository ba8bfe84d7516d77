"""Every bad input is a 4xx with a ``{status, message, reason}`` JSON body, never a 500."""

from __future__ import annotations

import httpx
import pytest


def _assert_error(resp: httpx.Response, status: int, reason: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert body["status"] == status
    assert isinstance(body["message"], str) and body["message"]
    if reason is not None:
        assert body["reason"] == reason, body
    return body


@pytest.mark.parametrize("body, reason", [
    ({"text": ""}, "empty_text"),
    ({"text": "   \n\t "}, "empty_text"),
    ({"text": "x" * 251}, "text_too_long"),
    ({"text": "hi", "format": "ogg"}, "unsupported_format"),
    ({"text": "hi", "format": "wav", "sample_rate": 12345}, "bad_sample_rate"),
    ({"text": "hi", "format": "opus", "sample_rate": 44100}, "bad_sample_rate"),
    ({"text": "hi", "temperature": 5}, "invalid_request"),
    ({"text": "hi", "max_new_tokens": -1}, "invalid_request"),
    ({"text": "hi", "chunk_length": 1001}, "invalid_request"),
    ({"text": "hi", "opus_bitrate": 33}, "invalid_request"),
    ({"text": "hi", "mp3_bitrate": 100}, "invalid_request"),
    ({"txt": "missing text"}, "invalid_request"),
    ({"text": 42}, "invalid_request"),
    ({"text": "hi", "references": [{"audio": "!!notbase64!!", "text": "x"}]}, "invalid_request"),
    ({"text": "hi", "references": [{"audio": "aGVsbG8=", "text": "x"}]}, "bad_reference_audio"),
])
def test_bad_json_bodies(client, body, reason):
    _assert_error(client.post("/v1/tts", json=body), 400, reason)


def test_unknown_reference_id(client):
    _assert_error(client.post("/v1/tts", json={"text": "hi", "reference_id": "nobody"}), 404,
                  "reference_not_found")


def test_body_not_an_object(client):
    _assert_error(client.post("/v1/tts", json=["text"]), 400, "invalid_request")


def test_malformed_json(client):
    resp = client.post("/v1/tts", content=b'{"text": "hi"', headers={"content-type": "application/json"})
    _assert_error(resp, 400, "malformed_body")


def test_malformed_msgpack(client):
    resp = client.post("/v1/tts", content=b"\xc1\xff\x00garbage",
                       headers={"content-type": "application/msgpack"})
    _assert_error(resp, 400, "malformed_body")


def test_wrong_content_type(client):
    resp = client.post("/v1/tts", content=b"text=hi",
                       headers={"content-type": "application/x-www-form-urlencoded"})
    _assert_error(resp, 415, "unsupported_media_type")


def test_empty_body(client):
    _assert_error(client.post("/v1/tts", content=b"", headers={"content-type": "application/json"}), 400,
                  "empty_body")


def test_openai_bad_inputs(client):
    _assert_error(client.post("/v1/audio/speech", json={"input": "hi", "response_format": "ogg"}), 400,
                  "unsupported_format")
    _assert_error(client.post("/v1/audio/speech", json={"input": "hi", "speed": 4.5}), 400, "invalid_request")
    _assert_error(client.post("/v1/audio/speech", json={"input": "", "voice": "alloy"}), 400, "empty_text")
    _assert_error(client.post("/v1/audio/speech", json={"input": "hi", "voice": "unknown-voice"}), 400,
                  "unknown_voice")  # OpenAI's answer; Fish's unknown reference_id stays a 404
    _assert_error(client.post("/v1/tts", json={"text": "hi", "reference_id": "unknown-voice"}), 404,
                  "reference_not_found")
    _assert_error(client.post("/v1/audio/speech", json={"input": "hi", "model": ""}), 400, "unknown_model")


def test_auth_required(server):
    with server.client(auth=False) as anon:
        _assert_error(anon.post("/v1/tts", json={"text": "hi"}), 401, "unauthorized")
        resp = anon.post("/v1/tts", json={"text": "hi"}, headers={"Authorization": "Bearer wrong"})
        _assert_error(resp, 401, "unauthorized")
        assert resp.headers["www-authenticate"] == "Bearer"
        _assert_error(anon.get("/v1/references/list"), 401, "unauthorized")
        # probes and metrics stay open for kubelet and Prometheus
        assert anon.get("/healthz").status_code == 200
        assert anon.get("/readyz").status_code == 200
        assert anon.get("/metrics").status_code == 200


def test_unknown_route_and_method_are_json(client):
    _assert_error(client.get("/v1/nope"), 404, "not_found")
    _assert_error(client.get("/v1/tts"), 405, "method_not_allowed")


def test_server_still_serves_after_errors(client):
    resp = client.post("/v1/tts", json={"text": "still alive", "format": "pcm", "max_new_tokens": 5,
                                        "seed": 1})
    assert resp.status_code == 200
    assert len(resp.content) > 0

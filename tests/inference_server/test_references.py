"""Reference voices: add (JSON and msgpack), list, use, rename, delete; inline zero-shot references."""

from __future__ import annotations

import base64
import io

import msgpack
import numpy as np
import soundfile as sf


def _voice_wav(seconds: float = 1.0, sr: int = 44100, f0: float = 180.0) -> bytes:
    t = np.arange(int(seconds * sr)) / sr
    x = 0.3 * np.sin(2 * np.pi * f0 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
    buf = io.BytesIO()
    sf.write(buf, x.astype(np.float32), sr, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def test_reference_lifecycle(client, server):
    wav = _voice_wav()
    resp = client.post("/v1/references/add", json={"id": "alice", "audio": base64.b64encode(wav).decode(),
                                                    "text": "A short reference."})
    assert resp.status_code == 200, resp.text
    assert resp.json()["reference_id"] == "alice"
    # a duplicate id is a conflict
    dup = client.post("/v1/references/add", json={"id": "alice", "audio": base64.b64encode(wav).decode(),
                                                   "text": "again"})
    assert dup.status_code == 409 and dup.json()["reason"] == "reference_exists"
    # msgpack carries raw bytes
    body = msgpack.packb({"id": "bob", "audio": _voice_wav(0.8, 22050, 120.0), "text": "Bob speaking."})
    resp = client.post("/v1/references/add", content=body, headers={"content-type": "application/msgpack"})
    assert resp.status_code == 200, resp.text
    assert {"alice", "bob"} <= set(client.get("/v1/references/list").json()["reference_ids"])

    with_ref = client.post("/v1/tts", json={"text": "Cloned voice.", "reference_id": "alice", "format": "wav",
                                            "max_new_tokens": 20, "seed": 11})
    plain = client.post("/v1/tts", json={"text": "Cloned voice.", "format": "wav", "max_new_tokens": 20,
                                         "seed": 11})
    assert with_ref.status_code == 200, with_ref.text
    a, sr = sf.read(io.BytesIO(with_ref.content))
    assert sr == 44100 and a.size > 0
    assert with_ref.content != plain.content  # the reference conditions the prompt

    # persisted on disk as <id>.npz in the references dir
    ren = client.post("/v1/references/update", json={"old_reference_id": "bob", "new_reference_id": "robert"})
    assert ren.status_code == 200, ren.text
    ids = client.get("/v1/references/list").json()["reference_ids"]
    assert "robert" in ids and "bob" not in ids
    assert client.post("/v1/tts", json={"text": "hi", "reference_id": "bob"}).status_code == 404
    assert client.post("/v1/tts", json={"text": "hi", "reference_id": "robert", "format": "pcm",
                                        "max_new_tokens": 5, "seed": 1}).status_code == 200

    deleted = client.request("DELETE", "/v1/references/delete", json={"reference_id": "robert"})
    assert deleted.status_code == 200
    gone = client.request("DELETE", "/v1/references/delete", json={"reference_id": "robert"})
    assert gone.status_code == 404 and gone.json()["reason"] == "reference_not_found"


def test_reference_bad_inputs(client):
    wav = base64.b64encode(_voice_wav()).decode()
    bad_id = client.post("/v1/references/add", json={"id": "../etc/passwd", "audio": wav, "text": "x"})
    assert bad_id.status_code == 400
    nope = base64.b64encode(b"nope").decode()
    bad_audio = client.post("/v1/references/add", json={"id": "carol", "audio": nope, "text": "x"})
    assert bad_audio.status_code == 400 and bad_audio.json()["reason"] == "bad_reference_audio"
    assert client.post("/v1/references/delete", json={}).status_code == 400


def test_inline_references_msgpack(client):
    body = msgpack.packb({"text": "Zero shot.", "format": "pcm", "max_new_tokens": 15, "seed": 4,
                          "references": [{"audio": _voice_wav(0.7), "text": "Reference words."}]})
    resp = client.post("/v1/tts", content=body, headers={"content-type": "application/msgpack"})
    assert resp.status_code == 200, resp.text
    assert len(resp.content) > 0

"""``bench serve`` counts a reply without audio, or one whose transfer broke, as an error.

Why: on 2026-12-04 every request of an H200 run failed inside the server after its 200 headers
(a missing module in the audio encoder) and the bench reported 0 errors and 0 frames/s. The server
now aborts such a transfer (``routes_tts._encoded`` re-raises), and the bench treats a broken or
empty reply as failed. These tests run the bench's request against a real uvicorn server whose
replies are (a) complete, (b) empty, (c) aborted after some audio the way a raising body aborts it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route
from ttsfleet.devtools.ports import free_port
from ttsfleet.inference.bench import EMPTY_REPLY, BenchConfig, _request

PCM = b"\x01\x00" * 4410  # 0.1 s of 16-bit mono at 44.1 kHz


async def _tts(request: Request) -> StreamingResponse:
    kind = request.path_params["kind"]

    async def body() -> AsyncIterator[bytes]:
        if kind == "empty":
            return
        yield PCM
        if kind == "abort":
            raise RuntimeError("generation failed after the headers")
        yield PCM

    headers = {"x-sample-rate": "44100", "x-frames-per-second": "21.53"}
    return StreamingResponse(body(), media_type="audio/pcm", headers=headers)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    app = Starlette(routes=[Route("/{kind}/v1/tts", _tts, methods=["POST"])])
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def _one(base_url: str, kind: str):
    cfg = BenchConfig(url=f"{base_url}/{kind}", levels=[1])

    async def go():
        async with httpx.AsyncClient(timeout=20) as client:
            return await _request(client, cfg, 0)

    return asyncio.run(go())


def test_a_complete_reply_counts_with_its_audio(base_url):
    s = _one(base_url, "ok")
    assert s.ok and s.status == 200
    assert s.audio_s == pytest.approx(0.2)


def test_an_empty_200_is_an_error(base_url):
    s = _one(base_url, "empty")
    assert not s.ok and s.status == EMPTY_REPLY and s.frames == 0


def test_a_transfer_aborted_after_audio_is_an_error(base_url):
    s = _one(base_url, "abort")
    assert not s.ok and s.frames == 0

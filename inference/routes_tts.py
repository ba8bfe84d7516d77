"""Synthesis over HTTP: Fish Audio's ``POST /v1/tts`` and OpenAI's ``POST /v1/audio/speech``.

Both routes go gate (key, draining/loading) → parse → validate → first segment to the engine (a
429 before any byte) → response. Fish answers a whole file unless ``streaming: true``; OpenAI's
route always streams as it generates (its SDK's ``with_streaming_response`` reads chunks while the
model is still decoding), as raw audio or, with ``stream_format: "sse"``, OpenAI's event stream.
A client that hangs up cancels its decode, streamed or not, and is counted as 499.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response, StreamingResponse
from ttsfleet.inference.api import OPENAI_VOICES, ApiError, SpeechRequest, TTSRequest, parse_model
from ttsfleet.inference.audio_io import AudioEncoder
from ttsfleet.inference.http_common import authorize, get_state, read_body, received_at
from ttsfleet.inference.openapi_docs import AUDIO_RESPONSES, request_body
from ttsfleet.inference.server_state import ServerState
from ttsfleet.inference.synthesis import Generation, Job, validate

log = logging.getLogger("ttsfleet.inference.server")

MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "mp3": "audio/mpeg", "opus": "audio/ogg",
               "flac": "audio/flac", "aac": "audio/aac"}

router = APIRouter(tags=["synthesis"], dependencies=[Depends(authorize)])


@router.post("/v1/tts", summary="Text to speech (Fish Audio)", response_class=Response,
             responses=AUDIO_RESPONSES, openapi_extra=request_body("TTSRequest"))
async def tts(request: Request, state: ServerState = Depends(get_state)) -> Response:
    body = await _body(request, state)
    with state.admitting():
        req = parse_model(TTSRequest, body)
        job, gen, enc = await start(state, req, received_at(request))
    return await respond(request, state, job, gen, enc, stream=req.streaming, sse=False)


@router.post("/v1/audio/speech", summary="Text to speech (OpenAI)", response_class=Response,
             responses=AUDIO_RESPONSES, openapi_extra=request_body("SpeechRequest"))
async def speech(request: Request, state: ServerState = Depends(get_state)) -> Response:
    body = await _body(request, state)
    with state.admitting():
        sreq = parse_model(SpeechRequest, body)
        _check_openai_names(state, sreq)
        job, gen, enc = await start(state, sreq.to_tts(), received_at(request))
    return await respond(request, state, job, gen, enc, stream=True, sse=sreq.sse)


def _check_openai_names(state: ServerState, sreq: SpeechRequest) -> None:
    """OpenAI answers an unknown model or voice with 400 (Fish's unknown ``reference_id`` stays 404)."""
    sreq.check_model(state.cfg.model_name)
    voice = sreq.reference_voice
    if voice is not None and not state.references.has(voice):
        raise ApiError(400, f"voice {voice!r} is neither a built-in voice ({', '.join(OPENAI_VOICES)}) nor a "
                       "stored reference voice", "unknown_voice")


async def _body(request: Request, state: ServerState) -> object:
    """The parsed body of a synthesis request, checked against the serving state before and after it
    arrives (a drain that began meanwhile answers 503: the body's sender was not being served yet)."""
    state.check_serving()
    body = await read_body(request, state)
    state.check_serving()
    return body


async def start(state: ServerState, req: TTSRequest, received: float | None = None
                ) -> tuple[Job, Generation, AudioEncoder]:
    """Validate and submit the first segment; only a request the engine took counts as in flight.
    ``received``: when the app got the request (:func:`~ttsfleet.inference.http_common.received_at`), where
    its time to first audio starts.

    Everything that can fail comes first, so nothing stands between the engine accepting the
    request and the response that releases it."""
    job = await validate(state, req)
    gen = Generation(state, req, job.references, job.arrived, received=received)
    enc = _encoder(job, gen)
    gen.submit(job.segments[0], more_may_follow=len(job.segments) > 1)
    state.enter()
    return job, gen, enc


def _encoder(job: Job, gen: Generation) -> AudioEncoder:
    prosody = job.req.prosody
    return AudioEncoder(job.fmt, job.sample_rate, gen.codec_rate, mp3_bitrate=job.req.mp3_bitrate,
                        opus_bitrate=job.req.opus_bps, volume_db=prosody.volume if prosody else 0.0,
                        speed=prosody.speed if prosody else 1.0)


async def respond(request: Request, state: ServerState, job: Job, gen: Generation, enc: AudioEncoder, *,
                  stream: bool, sse: bool) -> Response:
    headers = {"X-Sample-Rate": str(job.sample_rate), "X-Model": state.cfg.model_name,
               "X-Frames-Per-Second": f"{gen.frames_per_second:.4f}"}
    if not stream:
        return await _whole(request, state, job, gen, enc, headers)
    # the app's own time before the response starts (W3C Server-Timing): a client that subtracts it from
    # its wait for the headers has the request's time outside the app (its way in, the headers' way out)
    headers["Server-Timing"] = f"app;dur={(time.perf_counter() - gen.started) * 1000:.2f}"
    body = _sse_events(job, gen, enc) if sse else _audio_stream(job, gen, enc)

    def closed() -> None:
        if not gen.finished:  # the body never ran to its end (client gone before or during it)
            gen.cancel()
            enc.abort()
            gen.finish(499, "client_disconnected")
        state.leave()

    media = "text/event-stream" if sse else MEDIA_TYPES[job.fmt]
    return ClosingStreamingResponse(body, closed, media_type=media, headers=headers)


async def _whole(request: Request, state: ServerState, job: Job, gen: Generation, enc: AudioEncoder,
                 headers: dict[str, str]) -> Response:
    """Decode everything, encode with exact headers; stop decoding as soon as the client is gone."""
    try:
        parts = await _collect_unless_disconnected(request, gen.audio(job.segments))
        if parts is None:
            gen.finish(499, "client_disconnected")
            return Response(status_code=499)
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        body = await asyncio.to_thread(enc.encode_all, audio)
    except ApiError:
        raise
    except Exception as exc:
        log.error("generation failed: %s", exc)
        gen.finish(500, "generation_failed")
        err = ApiError(500, f"generation failed: {exc}", "generation_failed")
        err.counted = True
        raise err from None
    finally:
        state.leave()
    gen.mark_first_audio()
    gen.finish(200)
    return Response(body, media_type=MEDIA_TYPES[job.fmt], headers=headers)


async def _collect_unless_disconnected(request: Request, chunks: AsyncIterator[np.ndarray]
                                       ) -> list[np.ndarray] | None:
    """All chunks, or None once the client disconnected (the collection is cancelled, its slot freed)."""

    async def collect() -> list[np.ndarray]:
        return [c async for c in chunks]

    async def disconnected() -> None:  # the body is read: receive() now only returns on disconnect
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, gone = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (work, gone):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    return None if work.cancelled() else work.result()


async def _audio_stream(job: Job, gen: Generation, enc: AudioEncoder) -> AsyncIterator[bytes]:
    async for data in _encoded(job, gen, enc):
        yield data


async def _sse_events(job: Job, gen: Generation, enc: AudioEncoder) -> AsyncIterator[bytes]:
    """OpenAI's speech event stream: ``speech.audio.delta`` (base64 audio) … ``speech.audio.done``."""
    async for data in _encoded(job, gen, enc):
        yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    if gen.status != 200:  # ended early: no done event, the client sees a cut stream
        return
    usage = {"input_tokens": gen.prompt_tokens, "output_tokens": gen.frames,
             "total_tokens": gen.prompt_tokens + gen.frames}
    yield _event({"type": "speech.audio.done", "usage": usage})


def _event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


async def _encoded(job: Job, gen: Generation, enc: AudioEncoder) -> AsyncIterator[bytes]:
    """Encoded bytes as frames decode; records the outcome (200, 499 on disconnect, 500 on failure)."""
    status, reason = 200, ""
    try:
        async for chunk in gen.audio(job.segments):
            data = await enc.push_async(chunk)
            if data:
                gen.mark_first_audio()
                yield data
        tail = await enc.finish_async()
        if tail:
            gen.mark_first_audio()
            yield tail
    except asyncio.CancelledError:
        status, reason = 499, "client_disconnected"
        raise
    except Exception as exc:  # headers are gone: count it, then abort the transfer (re-raised, the
        # chunked body never gets its last chunk), so the client sees a broken reply, never a short
        # one that looks complete
        log.error("streaming generation failed: %s", exc)
        status, reason = 500, "generation_failed"
        raise
    finally:
        if status != 200:
            enc.abort()
        gen.finish(status, reason)


class ClosingStreamingResponse(StreamingResponse):
    """Runs ``on_close`` however the response ends, even if the body was never started."""

    def __init__(self, content: Any, on_close: Any, **kw: Any):
        super().__init__(content, **kw)
        self._on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

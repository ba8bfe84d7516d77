"""Fish Audio's live WebSocket, ``/v1/tts/live``: text streams in while audio streams out.

The protocol is the one the official fish-audio-sdk speaks (``fishaudio.TTSClient.stream_websocket``
and the legacy ``fish_audio_sdk.WebSocketSession``): binary msgpack messages,

- in: ``{"event": "start", "request": {TTSRequest}}`` first, then any number of
  ``{"event": "text", "text": ...}`` and ``{"event": "flush"}``, then ``{"event": "stop"}``;
- out: ``{"event": "audio", "audio": bytes}`` … then ``{"event": "finish", "reason": "stop"}``
  (or ``"reason": "error"`` with a ``message``).

Text is buffered and cut into segments as it arrives (a sentence of at least ``min_chunk_length``
characters, at most ``chunk_length``; a shorter finished sentence once no text came for
``IDLE_FLUSH_S``, so a client that waits for audio is never stuck; ``flush`` and ``stop`` cut
whatever is buffered). Each segment
goes to the engine as soon as it is cut, conditioned on the previous one, and its audio is sent as
it decodes through one encoder for the whole session (one continuous file). Time to first audio is
measured from the first text to the first audio sent.

Real-time mode, as the write-up describes it: when the session opens (a cloned voice: its
references make a prompt head of hundreds of tokens) the voice head is prefilled at once, while the
client is still getting its text ready (:meth:`Generation.open_prefix`); the first segment then
prefills only its own tokens, so that prefill is off the first audio's path. The head's job runs in
the background (requests whose first audio is awaited go first) until the first segment is cut while
it is not done: then it is marked urgent (:meth:`Generation.need_prefix`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any

import msgpack
from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocketDisconnect
from ttsfleet.inference.api import ApiError, TTSRequest, parse_model
from ttsfleet.inference.audio_io import AudioEncoder
from ttsfleet.inference.http_common import check_key
from ttsfleet.inference.server_state import ServerState
from ttsfleet.inference.synthesis import (
    Generation,
    GenerationFailed,
    check_output,
    clean_text,
    resolve_references,
)

log = logging.getLogger("ttsfleet.inference.live")

router = APIRouter(tags=["live"])

#: Largest audio payload per message: the SDK's WebSocket client accepts 64 KiB messages by default.
MAX_AUDIO_MESSAGE = 16 * 1024
#: Segments cut but not yet spoken; when full, the session stops reading (TCP back-pressure).
MAX_PENDING_SEGMENTS = 16
#: A finished sentence shorter than ``min_chunk_length`` is spoken once the client paused this long.
IDLE_FLUSH_S = 0.3
_SENTENCE_END = re.compile(r"[.!?;:\u3002\uff01\uff1f]\s")


class TextBuffer:
    """Collects streamed text and cuts it into segments the way a listener would want them early."""

    def __init__(self, chunk_length: int, min_chunk_length: int):
        self.chunk_length = chunk_length
        self.min_chunk_length = min_chunk_length
        self.text = ""

    def add(self, text: str) -> list[str]:
        """Append ``text``; return the segments that are complete now."""
        self.text += text
        out = []
        while (cut := self._cut()) > 0:
            out.append(self.text[:cut])
            self.text = self.text[cut:]
        return out

    def flush(self) -> list[str]:
        text, self.text = self.text, ""
        return [text] if text.strip() else []

    def finished_sentences(self) -> list[str]:
        """Everything up to the last sentence end, however short (the client paused after it)."""
        ends = [m.end() for m in _SENTENCE_END.finditer(self.text + " ")]
        if not ends:
            return []
        cut = min(ends[-1], len(self.text))
        text, self.text = self.text[:cut], self.text[cut:]
        return [text] if text.strip() else []

    @property
    def has_sentence(self) -> bool:
        return _SENTENCE_END.search(self.text + " ") is not None

    def _cut(self) -> int:
        """Where the next segment ends (0 = not yet): the last sentence end that makes it long enough,
        or, past ``chunk_length``, the last sentence end or space before it (or a hard cut)."""
        window = self.text[:self.chunk_length + 1]
        ends = [m.end() for m in _SENTENCE_END.finditer(window)]
        if len(self.text) > self.chunk_length:
            if ends:
                return ends[-1]
            space = window.rfind(" ")
            return space + 1 if space > 0 else self.chunk_length
        return ends[-1] if ends and ends[-1] >= self.min_chunk_length else 0


class LiveSession:
    """One accepted WebSocket: a reader cutting text into segments, a speaker sending their audio."""

    def __init__(self, state: ServerState, ws: WebSocket, req: TTSRequest, refs: list[tuple[Any, str]],
                 sample_rate: int):
        self.state = state
        self.ws = ws
        self.req = req
        self.gen = Generation(state, req, refs, time.perf_counter())
        prosody = req.prosody
        self.enc = AudioEncoder(req.format, sample_rate, self.gen.codec_rate, mp3_bitrate=req.mp3_bitrate,
                                opus_bitrate=req.opus_bps, volume_db=prosody.volume if prosody else 0.0,
                                speed=prosody.speed if prosody else 1.0,
                                stream_flac=True)  # live: FLAC of unknown length (ffmpeg reads it)
        self.buffer = TextBuffer(req.chunk_length, req.min_chunk_length)
        self.segments: asyncio.Queue[str | None] = asyncio.Queue(MAX_PENDING_SEGMENTS)
        self.first_text: float | None = None
        self.prefix: asyncio.Future[None] | None = None  # the voice head's prefill (real-time mode)
        self._prefix_awaited = False

    async def run(self) -> None:
        self.prefix = asyncio.ensure_future(self.gen.open_prefix())  # real-time mode: before any text
        reader = asyncio.ensure_future(self._read())
        speaker = asyncio.ensure_future(self._speak())
        try:
            done, _ = await asyncio.wait({reader, speaker}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            await speaker  # the reader saw stop: speak what is left
        except ApiError as err:
            self.gen.finish(err.status, err.reason)
            await _finish_error(self.ws, err.message)
        except GenerationFailed as exc:
            log.error("live generation failed: %s", exc)
            self.gen.finish(500, "generation_failed")
            await _finish_error(self.ws, f"generation failed: {exc}")
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:  # starlette: RuntimeError after close
            log.info("live session ended early: %r", exc)
            self.gen.finish(499, "client_disconnected")
        finally:
            for task in (reader, speaker, self.prefix):
                task.cancel()
            await asyncio.gather(reader, speaker, self.prefix, return_exceptions=True)
            self.gen.cancel()
            self.enc.abort()
            if not self.gen.finished:
                self.gen.finish(499, "client_disconnected")

    async def _read(self) -> None:
        """Client events → segments (None = stop). A disconnect raises WebSocketDisconnect."""
        if self.req.text.strip():
            await self._queue(self.buffer.add(self.req.text))
        while True:
            try:
                event = await asyncio.wait_for(_receive_event(self.ws),
                                               IDLE_FLUSH_S if self.buffer.has_sentence else None)
            except TimeoutError:
                await self._queue(self.buffer.finished_sentences())
                continue
            kind = event.get("event")
            if kind == "text":
                text = event.get("text")
                if not isinstance(text, str):
                    raise ApiError(400, "a text event needs a string 'text'", "invalid_request")
                await self._queue(self.buffer.add(text))
            elif kind == "flush":
                await self._queue(self.buffer.flush())
            elif kind == "stop":
                await self._queue(self.buffer.flush())
                await self.segments.put(None)
                return
            elif kind == "start":
                raise ApiError(400, "the session has already started", "invalid_request")
            # unknown events are ignored, as the SDK ignores unknown events from the server

    async def _queue(self, segments: list[str]) -> None:
        for segment in segments:
            text = clean_text(self.state, self.req, segment)
            if text:
                if self.first_text is None:
                    self.first_text = self.gen.arrived = time.perf_counter()
                await self.segments.put(text)

    async def _speak(self) -> None:
        """Segments → engine → audio messages, in order; then the tail and ``finish: stop``."""
        st = self.state
        while (text := await self.segments.get()) is not None:
            await self._prefix_ready()
            self.gen.submit(text)  # the first may be a 429; later ones are never shed
            st.enter()
            try:
                async for chunk in self.gen.segment_audio():
                    await self._send_audio(await self.enc.push_async(chunk))
            finally:
                st.leave()
        await self._send_audio(await self.enc.finish_async())
        self.gen.finish(200, realtime=False)
        await self.ws.send_bytes(msgpack.packb({"event": "finish", "reason": "stop"}))

    async def _prefix_ready(self) -> None:
        """Wait for the voice head's prefill begun at open (its end is near by now); a failed one only
        means the segments prefill whole. Not done yet: the listener's first-audio clock now runs on
        it, so it is marked urgent (the engine plans it ahead of other sessions' head jobs)."""
        if self.prefix is None or self._prefix_awaited:
            return
        self._prefix_awaited = True  # once: the later segments find it settled
        if not self.prefix.done():
            self.gen.need_prefix()
        try:
            await asyncio.shield(self.prefix)
        except Exception:
            log.exception("live: the voice head's prefill failed; prefilling the segments whole")

    async def _send_audio(self, data: bytes) -> None:
        for i in range(0, len(data), MAX_AUDIO_MESSAGE):
            if self.first_text is not None:  # TTFA: first text in -> first audio out
                self.gen.mark_first_audio()
            piece = data[i:i + MAX_AUDIO_MESSAGE]
            await self.ws.send_bytes(msgpack.packb({"event": "audio", "audio": piece}))


@router.websocket("/v1/tts/live")
async def live(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.tts
    try:
        check_key(state, ws.headers)
        state.check_serving()
    except ApiError as err:
        state.count(err.status, err.reason)
        await _deny(ws, err)
        return
    await ws.accept()
    event = await _start_event(state, ws)
    if event is not None:
        with state.admitting():  # a drain waits for open sessions, not only for segments in the engine
            session = await _open(state, ws, event)
            if session is not None:
                await session.run()
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await ws.close()


async def _start_event(state: ServerState, ws: WebSocket) -> dict[str, Any] | None:
    """The first event, within ``body_timeout_s`` (like an HTTP body: not load, a drain does not wait
    for it); None when the client left, the wait ran out (408) or the server began draining (503)."""
    try:
        async with state.reading_body("the start event"):
            event = await _receive_event(ws)
        state.check_serving()
        return event
    except WebSocketDisconnect:
        state.count(499, "client_disconnected")
    except ApiError as err:
        state.count(err.status, err.reason)
        await _finish_error(ws, err.message)
    return None


async def _open(state: ServerState, ws: WebSocket, event: dict[str, Any]) -> LiveSession | None:
    """Check the ``start`` event; a bad one ends the session with ``finish: error``."""
    try:
        if event.get("event") != "start" or not isinstance(event.get("request"), dict):
            raise ApiError(400, "the first event must be {'event': 'start', 'request': {...}}",
                           "invalid_request")
        req = parse_model(TTSRequest, event["request"])
        sample_rate = check_output(req)
        refs = await resolve_references(state, req)
    except ApiError as err:
        state.count(err.status, err.reason)
        await _finish_error(ws, err.message)
        return None
    return LiveSession(state, ws, req, refs, sample_rate)


async def _receive_event(ws: WebSocket) -> dict[str, Any]:
    """One client event: a msgpack (binary) or JSON (text) map."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    try:
        if message.get("bytes") is not None:
            event = msgpack.unpackb(message["bytes"], raw=False, strict_map_key=False)
        else:
            import json

            event = json.loads(message.get("text") or "")
    except Exception as exc:
        raise ApiError(400, f"malformed event: {type(exc).__name__}", "malformed_body") from None
    if not isinstance(event, dict):
        raise ApiError(400, "an event must be a map with an 'event' key", "invalid_request")
    return event


async def _finish_error(ws: WebSocket, message: str) -> None:
    with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):
        await ws.send_bytes(msgpack.packb({"event": "finish", "reason": "error", "message": message}))


async def _deny(ws: WebSocket, err: ApiError) -> None:
    """Refuse the handshake with the JSON error (401, 503) where the server can send one, else close."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JSONResponse(err.body(), status_code=err.status, headers=err.headers))
    else:
        await ws.close(code=1008, reason=err.message[:120])

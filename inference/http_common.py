"""What every route shares: the app state as a dependency, API-key checks, bounded body reading
(JSON, msgpack, multipart), content negotiation for small replies, and the error handlers that make
every failure a ``{status, message, reason}`` JSON body counted in ``/metrics``.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Mapping
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from ttsfleet.inference.api import MSGPACK_TYPES, ApiError, decode_body
from ttsfleet.inference.server_state import ServerState

from ttsfleet.errors import validation_text

log = logging.getLogger("ttsfleet.inference.server")

#: The ASGI scope key under which :class:`StampReceived` keeps when the app received the request.
RECEIVED = "ttsfleet.received"

#: Routes whose outcomes are synthesis requests in ``inference_requests`` (by status).
SYNTHESIS_PATHS = frozenset({"/v1/tts", "/v1/audio/speech", "/v1/tts/live"})


class StampReceived:
    """Pure ASGI middleware: stamps each HTTP and WebSocket scope with ``time.perf_counter()`` as the app
    receives it, before any dependency, body read or parse.

    Why: the handler's own arrival mark comes after all of that, so time to first audio counted from it
    left out whatever a busy server spends getting a request to its handler (on an H100 at c=128 the
    server's first-audio p99 was 218-244 ms where its client measured 729-1,995, 2026-12-07d).
    Counted from this stamp, that part is the ``intake`` stage of ``inference_ttfa_stage_seconds``."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            scope[RECEIVED] = time.perf_counter()
        await self.app(scope, receive, send)


def received_at(request: Request) -> float | None:
    """When the app received ``request`` (:class:`StampReceived`), or None on an app without the stamp."""
    return request.scope.get(RECEIVED)


async def get_state(request: Request) -> ServerState:
    """The app's serving state. ``async`` on purpose, as every dependency here: FastAPI runs a plain
    ``def`` dependency on anyio's worker threads, and each such hop must win the GIL from the engine and
    codec threads before the handler can start (two hops per synthesis request before this, uncounted by
    the server's time to first audio)."""
    return request.app.state.tts


def check_key(state: ServerState, headers: Mapping[str, str]) -> None:
    """401 unless the ``Authorization: Bearer`` key is one of the configured keys (none = open)."""
    keys = state.cfg.api_keys
    if not keys:
        return
    scheme, _, token = headers.get("authorization", "").partition(" ")
    token_b = token.strip().encode()
    if scheme.lower() != "bearer" or not any(hmac.compare_digest(token_b, k.encode()) for k in keys):
        raise ApiError(401, "missing or invalid API key (Authorization: Bearer <key>)", "unauthorized",
                       {"WWW-Authenticate": "Bearer"})


async def authorize(request: Request, state: ServerState = Depends(get_state)) -> None:
    check_key(state, request.headers)


FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


async def read_body(request: Request, state: ServerState, forms: bool = False) -> Any:
    """The body as data, at most ``max_body_bytes``: JSON, msgpack, or (``forms``) a form whose files
    are bytes and whose repeated fields are lists.

    A body still arriving is not load: it is bounded by ``body_timeout_s`` (408), a client that hangs
    up while sending it is a 499 (no traceback, no 500), and once a drain has finished every request
    that is still reading its body is answered 503 at once, so one stalled upload cannot hold a
    scale-down."""
    limit = state.cfg.max_body_bytes
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise ApiError(413, f"body is larger than {limit} bytes", "body_too_large")
    raw = bytearray()
    async with state.reading_body("the request body"):
        try:
            async for part in request.stream():
                raw.extend(part)
                if len(raw) > limit:
                    raise ApiError(413, f"body is larger than {limit} bytes", "body_too_large")
        except ClientDisconnect:
            raise ApiError(499, "client disconnected while sending the body", "client_disconnected") from None
    ctype = request.headers.get("content-type", "")
    if forms and ctype.split(";")[0].strip().lower() in FORM_TYPES:
        return await _parse_form(request, bytes(raw))
    return decode_body(bytes(raw), ctype)


async def _parse_form(request: Request, raw: bytes) -> dict[str, Any]:
    """Upstream fish-speech's and Fish's form uploads: text fields as strings, files as their bytes."""
    from starlette.datastructures import UploadFile
    from starlette.formparsers import FormParser, MultiPartException, MultiPartParser

    async def once():
        yield raw

    multipart = request.headers.get("content-type", "").lower().startswith("multipart/")
    try:
        if multipart:
            form = await MultiPartParser(request.headers, once(), max_files=16, max_fields=64).parse()
        else:
            form = await FormParser(request.headers, once()).parse()
    except (MultiPartException, ValueError, AssertionError, KeyError) as exc:
        raise ApiError(400, f"malformed form body: {exc}", "malformed_body") from None
    out: dict[str, Any] = {}
    for key, value in form.multi_items():
        item = await value.read() if isinstance(value, UploadFile) else value
        if key not in out:
            out[key] = item
        elif isinstance(out[key], list):
            out[key].append(item)
        else:
            out[key] = [out[key], item]
    await form.close()
    return out


def wants_msgpack(request: Request) -> bool:
    """Upstream's negotiation for small replies: ``?format=msgpack|json`` first, then ``Accept``."""
    fmt = request.query_params.get("format", "").strip().lower()
    if fmt in ("msgpack", "application/msgpack"):
        return True
    if fmt in ("json", "application/json"):
        return False
    accept = request.headers.get("accept", "").lower()
    return any(t in accept for t in MSGPACK_TYPES) and "application/json" not in accept


def reply(request: Request, body: dict[str, Any], status: int = 200) -> Response:
    """A small reply in msgpack when the client asks for it, JSON otherwise."""
    if wants_msgpack(request):
        import msgpack

        return Response(msgpack.packb(body), status_code=status, media_type="application/msgpack")
    return JSONResponse(body, status_code=status)


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every failure → a JSON error body; synthesis routes count it in ``inference_requests``."""

    def record(request: Request, status: int, reason: str) -> None:
        state: ServerState = request.app.state.tts
        if request.url.path in SYNTHESIS_PATHS:
            state.count(status, reason)
        else:
            state.metrics["inference_errors"].labels(state.label, reason).inc()

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        if not exc.counted:
            record(request, exc.status, exc.reason)
        return error_response(exc)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        reason = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse({"status": exc.status_code, "message": str(exc.detail), "reason": reason},
                            status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect):  # hung up mid-request: not our fault
        record(request, 499, "client_disconnected")
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError):
        msg = validation_text(exc, 5)
        record(request, 400, "invalid_request")
        return JSONResponse({"status": 400, "message": msg, "reason": "invalid_request"}, status_code=400)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception):  # a bug: still JSON, still counted
        log.exception("unhandled error on %s", request.url.path)
        record(request, 500, "internal_error")
        return JSONResponse({"status": 500, "message": f"internal error: {type(exc).__name__}",
                             "reason": "internal_error"}, status_code=500)

"""``/openapi.json`` documents the request bodies the routes parse themselves.

The synthesis and reference routes read their body by hand (JSON, msgpack or a multipart form, with
a size limit), so FastAPI cannot infer it; here each route names its pydantic model and the app's
schema gains those models as components, for both content types. Clients and schemathesis then
see exactly what the server validates.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic.json_schema import models_json_schema
from ttsfleet.inference.api import (
    AddReference,
    CreateVoice,
    DeleteReference,
    ErrorBody,
    SpeechRequest,
    TTSRequest,
    UpdateReference,
    UpdateVoice,
)

#: Models a route may name in :func:`request_body`.
BODY_MODELS = (TTSRequest, SpeechRequest, AddReference, DeleteReference, UpdateReference, CreateVoice,
               UpdateVoice)
_REF = "#/components/schemas/{model}"

AUDIO_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "Audio in the requested format (chunked when streamed; SSE events for "
                         "OpenAI's stream_format=sse)",
          "content": {"audio/mpeg": {}, "audio/wav": {}, "audio/pcm": {}, "audio/ogg": {}, "audio/flac": {},
                      "audio/aac": {}, "text/event-stream": {}}},
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    404: {"model": ErrorBody, "description": "Unknown reference voice"},
    413: {"model": ErrorBody, "description": "Body too large"},
    415: {"model": ErrorBody, "description": "Unsupported content type"},
    429: {"model": ErrorBody, "description": "Overloaded: retry after Retry-After seconds"},
    503: {"model": ErrorBody, "description": "Loading or draining"},
}
ERROR_RESPONSES = {k: v for k, v in AUDIO_RESPONSES.items() if k != 200}


def request_body(model: str, *, multipart: bool = False, only_forms: bool = False) -> dict[str, Any]:
    """``openapi_extra`` for a route whose body is ``model`` as JSON or msgpack (or a multipart form)."""
    schema = {"$ref": _REF.format(model=model)}
    content = {} if only_forms else {"application/json": {"schema": schema},
                                     "application/msgpack": {"schema": schema}}
    if multipart or only_forms:
        content["multipart/form-data"] = {"schema": schema}
    return {"requestBody": {"required": True, "content": content}}


def install_openapi(app: FastAPI) -> None:
    """Serve an OpenAPI document that includes the hand-parsed request bodies' models."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            doc = get_openapi(title=app.title, version=app.version, description=app.description,
                              routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in BODY_MODELS], ref_template=_REF)
            doc.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            doc["components"]["securitySchemes"] = {"BearerAuth": {"type": "http", "scheme": "bearer"}}
            app.openapi_schema = doc
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]

"""Fish Audio's voice-model API (``/model``), the subset the fishaudio SDK's ``voices`` client uses:
create a voice from samples (instant cloning), list, get, update, delete.

A voice here is a stored reference voice (the same store as ``/v1/references``): its id is what
``reference_id`` takes, and every stored reference shows up as a voice. Fields the cloud keeps
that mean nothing on one server (likes, author, cover image) are answered with neutral values so
the SDK's ``Voice`` model validates.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from ttsfleet.inference.api import ApiError, CreateVoice, UpdateVoice, parse_model
from ttsfleet.inference.http_common import authorize, get_state, read_body
from ttsfleet.inference.openapi_docs import ERROR_RESPONSES, request_body
from ttsfleet.inference.references import ReferenceStore, encode_reference
from ttsfleet.inference.server_state import ServerState

router = APIRouter(prefix="/model", tags=["voices"], dependencies=[Depends(authorize)],
                   responses=ERROR_RESPONSES)
_EPOCH = "1970-01-01T00:00:00+00:00"


def voice_entity(store: ReferenceStore, rid: str) -> dict[str, Any]:
    """One stored voice in the shape of Fish Audio's ``ModelEntity``."""
    meta = store.meta(rid)
    created = meta.get("created_at", _EPOCH)
    return {"_id": rid, "type": "tts", "title": meta.get("title", rid),
            "description": meta.get("description", ""), "cover_image": "", "train_mode": "fast",
            "state": "trained", "tags": meta.get("tags", []), "samples": [], "created_at": created,
            "updated_at": meta.get("updated_at", created), "languages": [],
            "visibility": meta.get("visibility", "private"), "lock_visibility": False,
            "like_count": 0, "mark_count": 0, "shared_count": 0, "task_count": 0,
            "author": {"_id": "local", "nickname": "ttsfleet", "avatar": ""}}


@router.post("", summary="Create a voice from samples", response_class=JSONResponse, status_code=201,
             openapi_extra=request_body("CreateVoice", only_forms=True))
async def create_voice(request: Request, state: ServerState = Depends(get_state)) -> JSONResponse:
    if not state.loaded.is_set():
        raise ApiError(503, "model is still loading", "loading", {"Retry-After": "5"})
    raw = await read_body(request, state, forms=True)
    with state.admitting():  # encoding is serving: a drain waits for it
        body = parse_model(CreateVoice, raw)
        codes = [await asyncio.to_thread(encode_reference, state.codec, state.encode_lock, audio)
                 for audio in body.voices]
    rid = uuid.uuid4().hex
    state.references.add(rid, np.concatenate([c.cpu().numpy() for c in codes], axis=1).astype(np.int64),
                         " ".join(t.strip() for t in body.texts if t.strip()),
                         {"title": body.title, "description": body.description, "tags": body.tags,
                          "visibility": body.visibility})
    return JSONResponse(voice_entity(state.references, rid), status_code=201)


@router.get("", summary="List voices", response_class=JSONResponse)
async def list_voices(state: ServerState = Depends(get_state), page_size: int = Query(10, ge=1, le=100),
                      page_number: int = Query(1, ge=1), title: str | None = None) -> JSONResponse:
    store = state.references
    items = [voice_entity(store, rid) for rid in store.ids()]
    if title:
        items = [v for v in items if title.lower() in v["title"].lower()]
    page = items[(page_number - 1) * page_size:page_number * page_size]
    return JSONResponse({"total": len(items), "items": page})


@router.get("/{voice_id}", summary="Get a voice", response_class=JSONResponse)
async def get_voice(voice_id: str, state: ServerState = Depends(get_state)) -> JSONResponse:
    return JSONResponse(voice_entity(state.references, voice_id))


@router.patch("/{voice_id}", summary="Update a voice's metadata", response_class=Response,
              openapi_extra=request_body("UpdateVoice", multipart=True))
async def update_voice(voice_id: str, request: Request, state: ServerState = Depends(get_state)) -> Response:
    body = parse_model(UpdateVoice, await read_body(request, state, forms=True))
    state.references.update_meta(voice_id, **body.model_dump(exclude_none=True))
    return Response(status_code=204)


@router.delete("/{voice_id}", summary="Delete a voice", response_class=Response)
async def delete_voice(voice_id: str, state: ServerState = Depends(get_state)) -> Response:
    state.references.delete(voice_id)
    return Response(status_code=204)

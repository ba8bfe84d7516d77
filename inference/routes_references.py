"""Reference voices over HTTP, as upstream fish-speech serves them: add (JSON, msgpack or multipart
form), list, delete, rename. Replies are JSON, or msgpack when asked (``?format=msgpack`` or
``Accept: application/msgpack``).
"""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from ttsfleet.inference.api import AddReference, ApiError, DeleteReference, UpdateReference, parse_model
from ttsfleet.inference.http_common import authorize, get_state, read_body, reply
from ttsfleet.inference.openapi_docs import ERROR_RESPONSES, request_body
from ttsfleet.inference.references import encode_reference
from ttsfleet.inference.server_state import ServerState

router = APIRouter(prefix="/v1/references", tags=["references"], dependencies=[Depends(authorize)],
                   responses=ERROR_RESPONSES)


@router.post("/add", summary="Add a reference voice", response_class=Response,
             openapi_extra=request_body("AddReference", multipart=True))
async def add_reference(request: Request, state: ServerState = Depends(get_state)) -> Response:
    if not state.loaded.is_set():
        raise ApiError(503, "model is still loading", "loading", {"Retry-After": "5"})
    body = await read_body(request, state, forms=True)
    with state.admitting():  # encoding is serving: a drain waits for it
        ref = parse_model(AddReference, body)
        if not ref.text.strip():
            raise ApiError(400, "text (the reference's transcript) is empty", "invalid_request")
        codes = await asyncio.to_thread(encode_reference, state.codec, state.encode_lock, ref.audio)
        state.references.add(ref.id, codes.cpu().numpy().astype(np.int64), ref.text)
    return reply(request, {"success": True, "message": f"reference {ref.id!r} added", "reference_id": ref.id})


@router.get("/list", summary="List reference voices", response_class=Response)
async def list_references(request: Request, state: ServerState = Depends(get_state)) -> Response:
    ids = state.references.ids()
    return reply(request, {"success": True, "reference_ids": ids, "message": f"{len(ids)} reference voices"})


@router.delete("/delete", summary="Delete a reference voice", response_class=Response,
               openapi_extra=request_body("DeleteReference"))
@router.post("/delete", summary="Delete a reference voice (POST form)", response_class=Response,
             openapi_extra=request_body("DeleteReference"), operation_id="delete_reference_post")
async def delete_reference(request: Request, state: ServerState = Depends(get_state)) -> Response:
    rid = parse_model(DeleteReference, await read_body(request, state)).reference_id
    state.references.delete(rid)
    return reply(request, {"success": True, "message": f"reference {rid!r} deleted", "reference_id": rid})


@router.post("/update", summary="Rename a reference voice", response_class=Response,
             openapi_extra=request_body("UpdateReference"))
async def update_reference(request: Request, state: ServerState = Depends(get_state)) -> Response:
    body = parse_model(UpdateReference, await read_body(request, state))
    old, new = body.old_reference_id, body.new_reference_id
    state.references.rename(old, new)
    return reply(request, {"success": True, "message": f"reference {old!r} renamed to {new!r}",
                           "old_reference_id": old, "new_reference_id": new, "reference_id": new})

"""The OpenAI routes: thin; each builds a Call and hands it to the pipeline."""

from __future__ import annotations

import os
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends
from starlette.requests import Request
from starlette.responses import Response

from gateway import pipeline
from gateway.errors import PayloadTooLarge
from gateway.flow import Call, Endpoint
from gateway.services import Services

router = APIRouter()


async def services(request: Request) -> Services:
    """Async on purpose: FastAPI runs a plain function dependency in a thread pool."""
    return request.app.state.services  # type: ignore[no-any-return]


ServicesDep = Annotated[Services, Depends(services)]


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, svc: ServicesDep) -> Response:
    return await _serve(request, "chat", svc)


@router.post("/v1/completions")
async def completions(request: Request, svc: ServicesDep) -> Response:
    return await _serve(request, "completions", svc)


@router.post("/v1/embeddings")
async def embeddings(request: Request, svc: ServicesDep) -> Response:
    return await _serve(request, "embeddings", svc)


@router.get("/v1/models")
async def list_models(svc: ServicesDep) -> Response:
    created = int(svc.started_at)
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "gateway"}
        for name in svc.backends.models
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def _serve(request: Request, endpoint: Endpoint, svc: ServicesDep) -> Response:
    call = Call(
        id=request.headers.get("x-request-id") or os.urandom(12).hex(),
        path=request.url.path,
        headers=dict(request.headers),
    )
    body = await _read_body(request, svc.settings.server.max_body_bytes, call.id)
    return await pipeline.handle(call, body, endpoint, svc)


async def _read_body(request: Request, limit: int, request_id: str) -> bytes:
    """Read at most `limit` bytes; refuse a larger body before holding it all in memory."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit, request_id)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit, request_id)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int, request_id: str) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"Request body exceeds the limit of {limit} bytes.",
        headers={"x-request-id": request_id},
    )

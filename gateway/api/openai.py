"""The OpenAI routes. Thin: each builds a Call and hands it to the pipeline.

The three proxied endpoints are a bare ASGI app in front of FastAPI rather than FastAPI
routes: on the hot path FastAPI's middleware stack, router matching, dependency solving
and Request/Headers objects cost more than the whole pipeline (as a py-spy profile under
concurrent calls shows).
Everything else (models, ops, admin) stays on FastAPI.
"""

from __future__ import annotations

import logging
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway import pipeline
from gateway.errors import GatewayError, InternalError, PayloadTooLarge
from gateway.flow import ENDPOINTS, Call, Endpoint, new_call_id
from gateway.services import Services
from gateway.stages import auth

log = logging.getLogger(__name__)
router = APIRouter()


async def services(request: Request) -> Services:
    """Async on purpose: FastAPI runs a plain function dependency in a thread pool."""
    svc: Services = request.app.state.services
    return svc


ServicesDep = Annotated[Services, Depends(services)]


@router.get("/v1/models")
async def list_models(request: Request, svc: ServicesDep) -> Response:
    """The configured models this caller's key may use."""
    principal = await auth.authenticate(request.headers, svc.keys)
    created = int(svc.started_at)
    data = [
        {"id": name, "object": "model", "created": created, "owned_by": "gateway"}
        for name in svc.backends.models
        if principal.models is None or name in principal.models
    ]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


class ProxyEndpoints:
    """POSTs to the proxied endpoints go to the pipeline; everything else to FastAPI."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = ENDPOINTS.get(scope.get("path", "")) if scope["type"] == "http" else None
        if endpoint is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        svc: Services = self.app.state.services
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        call = Call(
            id=new_call_id(),
            path=scope["path"],
            headers=headers,
        )
        try:
            response = await respond(call, receive, endpoint, svc)
        except Exception:
            # Only a failure in the accounting itself gets here: pipeline.handle turns
            # every other one into an accounted error.
            log.exception("unexpected error on %s (request %s)", scope["path"], call.id)
            failure = InternalError()
            failure.headers.update(pipeline.id_headers(call))
            response = error_response(failure)
        if response is not None:
            await response(scope, receive, send)


async def respond(
    call: Call, receive: Receive, endpoint: Endpoint, svc: Services
) -> Response | None:
    """The call's response, an error one included; None if the client left before sending
    its whole body. Every error is accounted for (ledger row, metrics, access line)."""
    try:
        body = await read_body(receive, call.headers, svc.settings.server.max_body_bytes)
    except GatewayError as exc:
        return error_response(pipeline.failed(call, svc, exc))
    if body is None:
        return None
    try:
        return await pipeline.handle(call, body, endpoint, svc, receive)
    except GatewayError as exc:
        return error_response(exc)


async def read_body(receive: Receive, headers: dict[str, str], limit: int) -> bytes | None:
    """Read at most `limit` bytes; refuse a larger body before holding it all in memory.

    None: the client disconnected first.
    """
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"Request body exceeds the limit of {limit} bytes.")


def error_response(exc: GatewayError) -> Response:
    return Response(
        exc.json(),
        status_code=exc.status,
        media_type=getattr(exc, "content_type", "application/json"),
        headers=exc.headers,
    )

"""create_app(settings): the FastAPI app, its lifespan (Services) and its one error mapping."""

from __future__ import annotations

import gc
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway import pipeline
from gateway.api import admin, openai, ops
from gateway.api.openai import ProxyEndpoints, error_response
from gateway.errors import GatewayError, InternalError, InvalidRequest, NotFound
from gateway.flow import Call, new_call_id
from gateway.services import Services
from gateway.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> ProxyEndpoints:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with Services.open(settings) as services:
            app.state.services = services
            if settings.server.gc_freeze:
                gc.collect()
                gc.freeze()
            yield

    app = FastAPI(
        title="gateway",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(openai.router)
    app.include_router(ops.router)
    app.include_router(admin.admin_router(settings))
    app.add_exception_handler(GatewayError, _gateway_error)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(Exception, _unexpected_error)
    return ProxyEndpoints(app)


async def _gateway_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, GatewayError)
    return error_response(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return error_response(NotFound(f"Unknown path: {request.url.path}"))
    err = GatewayError(str(exc.detail))
    err.status = exc.status_code
    err.type = "invalid_request_error"
    return error_response(err)


async def _validation_error(request: Request, exc: Exception) -> Response:
    """Name each bad field and what is wrong with it; never str(exc), which carries the
    handler's source file and line, and echoes the input."""
    assert isinstance(exc, RequestValidationError)
    problems = [(_field(e), e["msg"]) for e in exc.errors()]
    message = "; ".join(f"{field}: {msg}" for field, msg in problems) or "malformed request"
    param = problems[0][0] if problems else None
    return error_response(InvalidRequest(f"Invalid request: {message}", param=param))


def _field(error: Mapping[str, Any]) -> str:
    """('body', 'limits', 'rpm') -> 'limits.rpm'; the body itself (not JSON, not an
    object: its loc ends in a character position, if anything) -> 'body'."""
    loc = error.get("loc") or ("body",)
    if error.get("type") == "json_invalid" or len(loc) == 1:
        return str(loc[0])
    return ".".join(map(str, loc[1:]))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    """A bug in a route: logged in full for the operator, counted as a 500 and given an
    access line like a proxied call's (no ledger row: no model was called); the client
    gets no traceback. Starlette raises the exception again afterwards, for the server."""
    call = Call(id=new_call_id(), path=request.url.path)
    log.exception("unexpected error on %s (request %s)", call.path, call.id)
    failure = InternalError()
    call.status, call.error_type = failure.status, failure.type
    services: Services | None = getattr(request.app.state, "services", None)
    if services is not None:
        if services.settings.metrics_enabled:
            services.metrics.observe(call, services.backends.models)
        services.access.write(call)
    failure.headers.update(pipeline.id_headers(call))
    return error_response(failure)

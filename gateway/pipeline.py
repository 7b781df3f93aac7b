"""The order of the stages: the one place that knows how a call goes through the gateway.

parse -> route -> forward -> (stream relay | whole body) -> usage -> finish (metrics, log)
"""

from __future__ import annotations

import logging
import time

import orjson
from starlette.responses import Response

from gateway.backends import Backend, Model
from gateway.errors import GatewayError
from gateway.flow import Call, Endpoint, Route
from gateway.services import Services
from gateway.stages import forward, parse, usage
from gateway.stages.forward import EventScanner, StreamRelay, Unreachable

access_log = logging.getLogger("gateway.access")

MAX_ATTEMPTS = 2
"""A backend that refuses the connection costs one retry on another backend."""


async def handle(call: Call, body: bytes, endpoint: Endpoint, svc: Services) -> Response:
    """Take a call from its raw body to the response the client gets."""
    try:
        call.request = parse.parse(body, endpoint, call.headers.get("x-session-id"))
        model = svc.backends.model(call.request.model)
        payload = forward.upstream_body(call.request, model.upstream_name, body)
        backend, upstream = await dispatch(call, model, payload, svc)
        headers = {"x-request-id": call.id, **forward.passed_headers(upstream)}
        if call.request.stream:
            scanner = EventScanner(call, strip_usage=not call.request.include_usage)
            return StreamRelay(call, upstream, scanner, lambda c, s: finish(c, svc, s), headers)
        raw = await forward.read_body(upstream, backend)
    except GatewayError as exc:
        call.status, call.error_type = exc.status, exc.type
        exc.headers["x-request-id"] = call.id
        finish(call, svc)
        raise
    call.done_at = time.perf_counter()
    call.usage = usage.from_body(raw)
    finish(call, svc)
    return Response(raw, media_type="application/json", headers=headers)


async def dispatch(call: Call, model: Model, payload: bytes, svc: Services):  # type: ignore[no-untyped-def]
    """Choose a backend and send; a refused connection is retried once elsewhere."""
    tried: set[str] = set()
    for attempt in range(MAX_ATTEMPTS):
        backend = choose(model, svc, exclude=tried)
        call.route = Route(backend=backend.name, decision="miss")
        call.dispatched_at = time.perf_counter()
        backend.in_flight += 1
        try:
            return backend, await svc.upstream.send(call, backend, payload)
        except Unreachable:
            backend.in_flight -= 1
            call.dispatched_at = None
            svc.backends.mark_unreachable(backend)
            tried.add(backend.name)
            if attempt + 1 == MAX_ATTEMPTS or len(tried) == len(model.backends):
                raise
            svc.metrics.retries.labels(model.name).inc()
        except GatewayError:
            backend.in_flight -= 1
            call.dispatched_at = None
            raise
    raise AssertionError("unreachable")


def choose(model: Model, svc: Services, exclude: set[str]) -> Backend:
    candidates = [b for b in svc.backends.healthy(model) if b.name not in exclude]
    return min(candidates or svc.backends.healthy(model), key=lambda b: b.in_flight)


def finish(call: Call, svc: Services, scanner: EventScanner | None = None) -> None:
    """Account for a finished call. Never raises: the client's answer is already decided."""
    if call.done_at is None:
        call.done_at = time.perf_counter()
    if call.route is not None and call.dispatched_at is not None:
        svc.backends.backends[call.route.backend].in_flight -= 1
    record_metrics(call, svc)
    log_access(call)


def record_metrics(call: Call, svc: Services) -> None:
    m, req = svc.metrics, call.request
    model = req.model if req else ""
    endpoint = req.endpoint if req else ""
    m.requests.labels(model, endpoint, str(call.status), call.error_type or "").inc()
    if req is None or call.route is None:
        return
    labels = (model, call.route.backend, endpoint, "true" if req.stream else "false")
    if call.dispatched_at is not None:
        m.overhead.labels(endpoint).observe(call.dispatched_at - call.received_at)
    if call.latency is not None:
        m.e2e.labels(*labels).observe(call.latency)
    if req.stream and call.ttft is not None:
        m.ttft.labels(*labels).observe(call.ttft)
    if call.disconnected:
        m.disconnects.labels(model, endpoint).inc()
    u = call.usage
    if u is None:
        return
    if req.stream and call.first_byte_at and call.done_at and u.completion_tokens > 1:
        m.tpot.labels(*labels).observe(
            (call.done_at - call.first_byte_at) / (u.completion_tokens - 1)
        )
    tokens = m.tokens
    tokens.labels(model, call.route.backend, "prompt").inc(u.prompt_tokens)
    tokens.labels(model, call.route.backend, "cached").inc(u.cached_tokens)
    tokens.labels(model, call.route.backend, "completion").inc(u.completion_tokens)


def log_access(call: Call) -> None:
    if not access_log.isEnabledFor(logging.INFO):
        return
    u = call.usage
    line = {
        "request_id": call.id,
        "key_id": call.principal.key_id if call.principal else None,
        "model": call.model,
        "endpoint": call.request.endpoint if call.request else None,
        "backend": call.route.backend if call.route else None,
        "status": call.status,
        "error": call.error_type,
        "stream": call.request.stream if call.request else None,
        "prompt_tokens": u.prompt_tokens if u else None,
        "cached_tokens": u.cached_tokens if u else None,
        "completion_tokens": u.completion_tokens if u else None,
        "ttft_ms": round(call.ttft * 1000, 2) if call.ttft is not None else None,
        "latency_ms": round(call.latency * 1000, 2) if call.latency is not None else None,
        "disconnected": call.disconnected,
    }
    access_log.info(orjson.dumps(line).decode())

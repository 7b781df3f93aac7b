"""The order of the stages: the one place that knows how a call goes through the gateway.

parse -> prefix -> route (index + load) -> forward -> (stream relay | whole body)
      -> usage -> finish: index update, ledger, metrics, access log
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime

import orjson
from starlette.responses import Response
from starlette.types import Receive

from gateway import batching
from gateway.answers import Answer, read_whole
from gateway.backends import Backend, Model
from gateway.errors import GatewayError, InternalError, ShuttingDown
from gateway.flow import Call, Endpoint, PrefixKey, Route
from gateway.index import feedback
from gateway.ledger.models import to_usd
from gateway.services import Services
from gateway.stages import auth, forward, limits, parse, usage
from gateway.stages.costs import Rates
from gateway.stages.forward import Unreachable
from gateway.stages.relay import StreamRelay
from gateway.stages.sse import EventScanner

log = logging.getLogger(__name__)
access_log = logging.getLogger("gateway.access")

OVERHEAD_HEADER = "x-gateway-overhead-ms"
GATEWAY_ID_HEADER = "x-gateway-request-id"
ENDPOINTS = {path: endpoint for endpoint, path in forward.UPSTREAM_PATH.items()}
"""Endpoint by path, to label a call whose body never parsed."""


async def handle(
    call: Call, body: bytes, endpoint: Endpoint, svc: Services, receive: Receive
) -> Response:
    """Take a call from its raw body to the response the client gets.

    ``receive`` is the client connection's ASGI receive: while the call waits for its
    answer to begin, a client that disconnects cuts the wait (forward.ClientWatch).
    """
    try:
        call.client_request_id = parse.client_request_id(call.headers)
        call.principal = auth.known(call.headers, svc.keys) or await auth.authenticate(
            call.headers, svc.keys
        )
        call.request = parse.parse(body, endpoint, call.headers.get("x-session-id"))
        auth.authorize_model(call.principal, call.request.model)
        model = svc.backends.model(call.request.model)
        if endpoint != "embeddings":
            call.prefix = svc.prefix.key(call.request, model.encoding)
        waiting = limits.admit(call, len(body), svc.limits, svc.settings.auth.ratelimit_headers)
        if waiting is not None:  # the shared store must answer (most calls need not wait)
            await waiting
        payload = forward.upstream_body(call.request, model.upstream_name, body)
        with svc.upstream.watch(call, receive):
            backend, upstream = await svc.batching.submit(
                call, model, payload, lambda c, body, pin: dispatch(c, model, body, svc, pin)
            )
        headers = id_headers(call)
        headers["x-gateway-backend"] = backend.name
        headers.update(forward.passed_headers(upstream))
        if call.request.stream:
            headers[OVERHEAD_HEADER] = milliseconds(overhead(call))
            scanner = EventScanner(strip_usage=not call.request.include_usage)
            relay = StreamRelay(call, upstream, scanner, lambda c, s: finish(c, svc, s), headers)
            return with_quota(call, relay)
        raw = await read_whole(upstream)
    except GatewayError as exc:
        failed(call, svc, exc)
        raise
    except asyncio.CancelledError as exc:
        # Only the server cancels a call (a client that leaves is ClientClosedRequest): at
        # shutdown, past server.drain_timeout. Metered, and answered 503 rather than cut
        # off with uvicorn's plain-text 500: nothing awaits this task's cancellation, and
        # the client may send the call to another replica.
        if (task := asyncio.current_task()) is not None:
            task.uncancel()
        raise failed(call, svc, ShuttingDown()) from exc
    except Exception as exc:
        log.exception("unexpected error on %s (request %s)", call.path, call.id)
        raise failed(call, svc, InternalError()) from exc
    call.done_at = time.perf_counter()
    call.usage, call.reply = usage.from_body(raw)
    headers[OVERHEAD_HEADER] = milliseconds(finish(call, svc))
    return with_quota(call, Response(raw, media_type="application/json", headers=headers))


def failed(call: Call, svc: Services, exc: GatewayError) -> GatewayError:
    """Account for a call that ends in an error (ledger row, metrics, access line) and
    return the error to answer it with, marked with the call's id."""
    call.status, call.error_type = exc.status, exc.type
    exc.headers.update(id_headers(call))
    finish(call, svc)
    return exc


def id_headers(call: Call) -> dict[str, str]:
    """x-request-id echoes the client's own id (the gateway's if it sent none), and
    x-gateway-request-id always names the call as the ledger knows it."""
    return {"x-request-id": call.client_request_id or call.id, GATEWAY_ID_HEADER: call.id}


def with_quota(call: Call, response: Response) -> Response:
    """Add the x-ratelimit-* headers of a limited call, already bytes (built once per
    verdict, not encoded again for every response)."""
    if call.quota is not None:
        response.raw_headers.extend(call.quota.headers)
    return response


async def dispatch(
    call: Call, model: Model, payload: bytes, svc: Services, pin: str | None = None
) -> tuple[Backend, Answer]:
    """Route and send until the call has something for its client (Upstream.send).

    Until then nothing was sent, so a backend that fails (refused, reset, silent past its
    timeout, 5xx, ejected meanwhile) costs a retry on another healthy one, at most
    ``upstream.retries`` times; every failure counts toward its circuit breaker. ``pin``
    names the only backend for the first attempt (the batch stage's held calls).
    """
    tried: set[str] = set()
    exclude = {b.name for b in model.backends if b.name != pin} if pin else tried
    attempts = svc.settings.upstream.retries + 1
    for attempt in range(attempts):
        call.route = await route(call, model, svc, exclude)
        backend = svc.backends.backends[call.route.backend]
        call.dispatched_at = time.perf_counter()
        occupy(backend, svc, 1, call)
        try:
            answer = await svc.upstream.send(call, backend, payload)
        except BaseException as exc:
            occupy(backend, svc, -1, call)
            call.dispatched_at = None
            if not forward.retryable(exc):
                raise
            svc.backends.failed(backend, at_once=isinstance(exc, Unreachable))
            tried.add(backend.name)
            exclude = tried
            others = any(b.healthy and b.name not in tried for b in model.backends)
            if attempt + 1 == attempts or not others:
                raise
            svc.metrics.retries.labels(model.name).inc()
            continue
        svc.backends.succeeded(backend)
        remember(call, svc)
        return backend, answer
    raise AssertionError("unreachable")


async def route(call: Call, model: Model, svc: Services, exclude: set[str]) -> Route:
    """Ask the index who holds the prompt's prefix, then let the policy weigh it against load.

    The loads are read after the lookup, which may be a Redis round trip: read before, two
    calls arriving together would both see the same least loaded backend, as neither had
    been counted in yet. From the read to ``occupy`` there is no await.
    """
    assert call.request is not None
    key = call.prefix
    if key is None:  # embeddings: no KV cache to aim for
        candidates = svc.backends.candidates(model, exclude)
        least = min((c for c in candidates if c.healthy), key=lambda c: c.load)
        return Route(backend=least.name)
    matches = await svc.index.lookup(model.name, key.hashes) if key.hashes else {}
    return svc.policy.choose(
        model.name,
        key,
        matches,
        svc.backends.candidates(model, exclude),
        index_ok=svc.index.healthy,
        session=call.request.session,
    )


def finish(call: Call, svc: Services, scanner: EventScanner | None = None) -> float | None:
    """Account for a finished call; returns the gateway's overhead on it (seconds).

    Never raises: the client's answer is already decided.
    """
    if call.done_at is None:
        call.done_at = time.perf_counter()
    if scanner is not None:
        call.usage = scanner.usage
    if call.route is not None and call.dispatched_at is not None:
        own = batching.owns_upstream(call)
        if own:
            backend = svc.backends.backends[call.route.backend]
            occupy(backend, svc, -1, call)
            if call.status >= 500:  # a stream that broke off after it began
                svc.backends.failed(backend)
        if scanner is not None and (call.usage is None or (own and call.prefix is not None)):
            call.reply = scanner.reply()
        if call.usage is None:
            call.usage = estimate_usage(call, svc)
        if own:
            learn(call, svc)
    elif call.disconnected and call.route is not None:
        call.usage = estimate_usage(call, svc)  # left while its prompt was upstream
    svc.ledger.record(call)
    limits.settle(call, svc.limits)
    spent = overhead(call)
    if svc.settings.metrics_enabled:
        record_metrics(call, svc, spent)
    log_access(call, spent)
    return spent


def occupy(backend: Backend, svc: Services, delta: int, call: Call) -> None:
    """Count a call into (1) or out of (-1) the backend's load and its in-flight gauge."""
    backend.in_flight += delta
    if delta > 0:
        backend.backlog.admit(call)
    else:
        backend.backlog.release(call)
    if svc.settings.metrics_enabled:
        svc.metrics.count_in_flight(backend.name, delta)


def overhead(call: Call) -> float | None:
    """Seconds spent in the gateway itself rather than waiting on the backend.

    The time before dispatch, and for a whole-body answer also the time from its arrival
    until now. A stream's relay of each chunk is not counted: its header went out first.
    """
    if call.dispatched_at is None:
        return None
    spent = call.dispatched_at - call.received_at
    if call.request is not None and not call.request.stream and call.done_at is not None:
        spent += time.perf_counter() - call.done_at
    return spent


def milliseconds(seconds: float | None) -> str:
    return f"{seconds * 1000:.3f}" if seconds is not None else ""


def estimate_usage(call: Call, svc: Services) -> usage.Usage:
    """Count tokens ourselves when the backend's usage never came (e.g. a disconnect)."""
    assert call.request is not None
    encoding = svc.backends.model(call.request.model).encoding
    return usage.Usage(
        prompt_tokens=call.prefix.tokens if call.prefix else 0,
        completion_tokens=svc.prefix.count_tokens(call.reply, encoding) if call.reply else 0,
        estimated=True,
    )


def remember(call: Call, svc: Services) -> None:
    """The backend accepted the prompt: from now on it holds (or is computing) its prefix.

    Recorded at dispatch, not completion, so that concurrent calls sharing the prefix
    follow it there; the feedback from reported cached tokens corrects what was wrong.
    """
    if call.prefix is not None and call.prefix.hashes and call.route and call.request:
        svc.index.record(call.request.model, call.route.backend, call.prefix.hashes)


def learn(call: Call, svc: Services) -> None:
    """Correct the index with what the backend reported, and score the prediction."""
    key, route, u = call.prefix, call.route, call.usage
    if key is None or not key.hashes or route is None or call.request is None or u is None:
        return
    prefilled = not u.estimated or call.first_byte_at is not None
    encoding = svc.backends.model(call.request.model).encoding
    fb = feedback.observe(
        svc.index,
        call.request.model,
        route.backend,
        key,
        route.matched_blocks,
        u.cached_tokens if prefilled else None,
        (u.prompt_tokens or key.tokens) if prefilled else None,
        holds=svc.prefix.reply_key(call.request, encoding, call.reply) if prefilled else None,
    )
    if fb.reported and not u.estimated:
        time_rates(call, key, route, u, svc.backends.backends[route.backend].backlog.rates)
    if fb.reported and not u.estimated and svc.settings.metrics_enabled:
        predicted = route.predicted_cached_tokens / max(key.tokens, 1)
        reported = u.cached_tokens / max(u.prompt_tokens, 1)
        m = svc.metrics
        m.child(m.prediction, call.request.model, accuracy(predicted, reported)).inc()


def time_rates(call: Call, key: PrefixKey, route: Route, u: usage.Usage, rates: Rates) -> None:
    """Teach the backend's rates what the call cost: its report says what it prefilled,
    the relay's first byte how long that took (an answer that came whole has no first
    byte apart from its decode, so it teaches only the shares)."""
    cached = min(u.cached_tokens / max(u.prompt_tokens, 1), 1.0)
    prefilled = key.tokens * (1 - cached)  # in the gateway's tokens, as the queue is
    rates.served(cached, prefilled, u.completion_tokens)
    if call.first_byte_at is None or call.dispatched_at is None:
        return
    rates.observe(
        route.queued_tokens + prefilled, route.running, call.first_byte_at - call.dispatched_at
    )


def accuracy(predicted_share: float, reported_share: float) -> str:
    """Within 0.1 of the backend's cached share is accurate; otherwise over or under."""
    if abs(predicted_share - reported_share) <= 0.1:
        return "accurate"
    return "over" if predicted_share > reported_share else "under"


def record_metrics(call: Call, svc: Services, spent: float | None) -> None:
    m, req = svc.metrics, call.request
    # Only configured names become label values: a client's made-up model must not.
    model = req.model if req and req.model in svc.backends.models else ""
    endpoint = req.endpoint if req else ENDPOINTS.get(call.path, "")
    m.child(m.requests, model, endpoint, str(call.status), call.error_type or "").inc()
    if req is None or call.route is None:
        return
    route, u = call.route, call.usage
    s = m.series(model, route.backend, endpoint, "true" if req.stream else "false")
    if route.decision != "none":
        m.child(m.routing, model, route.decision).inc()
    if call.served_by != "upstream":
        m.child(m.batched, model, endpoint, call.served_by).inc()
    if call.disconnected:
        m.child(m.disconnects, model, endpoint).inc()
    if spent is not None:
        s.overhead.observe(spent)
    if call.latency is not None:
        s.e2e.observe(call.latency)
    if req.stream and call.ttft is not None:
        s.ttft.observe(call.ttft)
    if u is None:
        return
    if req.stream and call.first_byte_at and call.done_at and u.completion_tokens > 1:
        s.tpot.observe((call.done_at - call.first_byte_at) / (u.completion_tokens - 1))
    s.prompt.inc(u.prompt_tokens)
    s.cached.inc(u.cached_tokens)
    s.completion.inc(u.completion_tokens)
    if not u.estimated:
        s.predicted_cached.inc(route.predicted_cached_tokens)
        s.reported_cached.inc(u.cached_tokens)


def log_access(call: Call, spent: float | None) -> None:
    """One JSON line per call: the key's id, never the key; never the prompt."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    u, cost = call.usage, call.cost
    line = {
        "ts": datetime.fromtimestamp(call.received_wall, UTC).isoformat(timespec="milliseconds"),
        "request_id": call.id,
        "client_request_id": call.client_request_id,
        "key_id": call.principal.key_id if call.principal else None,
        "team": call.principal.team if call.principal else None,
        "model": call.model,
        "endpoint": call.request.endpoint if call.request else None,
        "backend": call.route.backend if call.route else None,
        "decision": call.route.decision if call.route else None,
        "status": call.status,
        "error": call.error_type,
        "stream": call.request.stream if call.request else None,
        "prompt_tokens": u.prompt_tokens if u else None,
        "cached_tokens": u.cached_tokens if u else None,
        "completion_tokens": u.completion_tokens if u else None,
        "estimated": u.estimated if u else None,
        "ttft_ms": round(call.ttft * 1000, 2) if call.ttft is not None else None,
        "latency_ms": round(call.latency * 1000, 2) if call.latency is not None else None,
        "overhead_ms": round(spent * 1000, 3) if spent is not None else None,
        "cost_usd": format(to_usd(cost.total), "f") if cost else None,
        "disconnected": call.disconnected,
        "served_by": call.served_by,
    }
    access_log.info(orjson.dumps(line).decode())

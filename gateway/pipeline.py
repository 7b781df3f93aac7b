"""The order of the stages: the one place that knows how a call goes through the gateway.

parse -> prefix -> route (index + load) -> forward -> (stream relay | whole body)
      -> usage -> finish: index update, ledger, metrics, access log
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime

import aiohttp
import orjson
from starlette.responses import Response

from gateway.backends import Backend, Model
from gateway.errors import GatewayError
from gateway.flow import Call, Endpoint, Route
from gateway.index import feedback
from gateway.services import Services
from gateway.stages import forward, parse, usage
from gateway.stages.forward import EventScanner, StreamRelay, Unreachable

access_log = logging.getLogger("gateway.access")

MAX_ATTEMPTS = 2
"""A backend that refuses the connection costs one retry on another backend."""
OVERHEAD_HEADER = "x-gateway-overhead-ms"


async def handle(call: Call, body: bytes, endpoint: Endpoint, svc: Services) -> Response:
    """Take a call from its raw body to the response the client gets."""
    try:
        call.request = parse.parse(body, endpoint, call.headers.get("x-session-id"))
        model = svc.backends.model(call.request.model)
        if endpoint != "embeddings":
            call.prefix = svc.prefix.key(call.request, model.encoding)
        payload = forward.upstream_body(call.request, model.upstream_name, body)
        backend, upstream = await dispatch(call, model, payload, svc)
        headers = {"x-request-id": call.id, **forward.passed_headers(upstream)}
        if call.request.stream:
            headers[OVERHEAD_HEADER] = milliseconds(overhead(call))
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
    headers[OVERHEAD_HEADER] = milliseconds(finish(call, svc, answer=usage.answer_text(raw)))
    return Response(raw, media_type="application/json", headers=headers)


async def dispatch(
    call: Call, model: Model, payload: bytes, svc: Services
) -> tuple[Backend, aiohttp.ClientResponse]:
    """Route and send; a refused connection is retried once on another backend."""
    tried: set[str] = set()
    for attempt in range(MAX_ATTEMPTS):
        call.route = await route(call, model, svc, tried)
        backend = svc.backends.backends[call.route.backend]
        call.dispatched_at = time.perf_counter()
        occupy(backend, svc, 1)
        try:
            upstream = await svc.upstream.send(call, backend, payload)
        except GatewayError as exc:
            occupy(backend, svc, -1)
            call.dispatched_at = None
            if not isinstance(exc, Unreachable):
                raise
            svc.backends.mark_unreachable(backend)
            tried.add(backend.name)
            if attempt + 1 == MAX_ATTEMPTS or len(tried) == len(model.backends):
                raise
            svc.metrics.retries.labels(model.name).inc()
            continue
        remember(call, svc)
        return backend, upstream
    raise AssertionError("unreachable")


async def route(call: Call, model: Model, svc: Services, exclude: set[str]) -> Route:
    """Ask the index who holds the prompt's prefix, then let the policy weigh it against load."""
    assert call.request is not None
    candidates = svc.backends.candidates(model, exclude)
    key = call.prefix
    if key is None:  # embeddings: no KV cache to aim for
        least = min((c for c in candidates if c.healthy), key=lambda c: c.load)
        return Route(backend=least.name)
    matches = await svc.index.lookup(model.name, key.hashes) if key.hashes else {}
    return svc.policy.choose(
        model.name,
        key,
        matches,
        candidates,
        index_ok=svc.index.healthy,
        session=call.request.session,
    )


def finish(
    call: Call, svc: Services, scanner: EventScanner | None = None, answer: str = ""
) -> float | None:
    """Account for a finished call; returns the gateway's overhead on it (seconds).

    ``answer``: the generated text of a whole-body answer (a stream's is in its scanner).
    Never raises: the client's answer is already decided.
    """
    if call.done_at is None:
        call.done_at = time.perf_counter()
    if call.route is not None and call.dispatched_at is not None:
        occupy(svc.backends.backends[call.route.backend], svc, -1)
        if call.usage is None:
            call.usage = estimate_usage(call, scanner, svc)
        learn(call, svc, usage.delivered_text(scanner.delivered) if scanner else answer)
    svc.ledger.record(call)
    spent = overhead(call)
    if svc.settings.metrics_enabled:
        record_metrics(call, svc, spent)
    log_access(call, spent)
    return spent


def occupy(backend: Backend, svc: Services, delta: int) -> None:
    """Count a call into (1) or out of (-1) the backend's load and its in-flight gauge."""
    backend.in_flight += delta
    if svc.settings.metrics_enabled:
        svc.metrics.in_flight.labels(backend.name).inc(delta)


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


def estimate_usage(call: Call, scanner: EventScanner | None, svc: Services) -> usage.Usage:
    """Count tokens ourselves when the backend's usage never came (e.g. a disconnect)."""
    assert call.request is not None
    encoding = svc.backends.model(call.request.model).encoding
    text = usage.delivered_text(scanner.delivered) if scanner else ""
    return usage.Usage(
        prompt_tokens=call.prefix.tokens if call.prefix else 0,
        completion_tokens=svc.prefix.count_tokens(text, encoding) if text else 0,
        estimated=True,
    )


def remember(call: Call, svc: Services) -> None:
    """The backend accepted the prompt: from now on it holds (or is computing) its prefix.

    Recorded at dispatch, not completion, so that concurrent calls sharing the prefix
    follow it there; the feedback from reported cached tokens corrects what was wrong.
    """
    if call.prefix is not None and call.prefix.hashes and call.route and call.request:
        svc.index.record(call.request.model, call.route.backend, call.prefix.hashes)


def learn(call: Call, svc: Services, answer: str = "") -> None:
    """Correct the index with what the backend reported, and score the prediction.

    A chat answer is recorded with its prompt: the backend caches the generated blocks
    too, and the conversation's next turn resends them as its history.
    """
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
        holds=svc.prefix.reply_key(call.request, encoding, answer) if prefilled else None,
    )
    if fb.reported and not u.estimated and svc.settings.metrics_enabled:
        predicted = route.predicted_cached_tokens / max(key.tokens, 1)
        reported = u.cached_tokens / max(u.prompt_tokens, 1)
        svc.metrics.prediction.labels(call.request.model, accuracy(predicted, reported)).inc()


def accuracy(predicted_share: float, reported_share: float) -> str:
    """Within 0.1 of the backend's cached share is accurate; otherwise over or under."""
    if abs(predicted_share - reported_share) <= 0.1:
        return "accurate"
    return "over" if predicted_share > reported_share else "under"


def record_metrics(call: Call, svc: Services, spent: float | None) -> None:
    m, req = svc.metrics, call.request
    # Only configured names become label values: a client's made-up model must not.
    model = req.model if req and req.model in svc.backends.models else ""
    endpoint = req.endpoint if req else ""
    m.requests.labels(model, endpoint, str(call.status), call.error_type or "").inc()
    if req is None or call.route is None:
        return
    labels = (model, call.route.backend, endpoint, "true" if req.stream else "false")
    if call.route.decision != "none":
        m.routing.labels(model, call.route.decision).inc()
    if call.served_by != "upstream":
        m.batched.labels(model, endpoint, call.served_by).inc()
    if spent is not None:
        m.overhead.labels(*labels).observe(spent)
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
    if not u.estimated:
        m.predicted_cached.labels(model).inc(call.route.predicted_cached_tokens)
        m.reported_cached.labels(model).inc(u.cached_tokens)


def log_access(call: Call, spent: float | None) -> None:
    """One JSON line per call: the key's id, never the key; never the prompt."""
    if not access_log.isEnabledFor(logging.INFO):
        return
    u, cost = call.usage, call.cost
    line = {
        "ts": datetime.fromtimestamp(call.received_wall, UTC).isoformat(timespec="milliseconds"),
        "request_id": call.id,
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
        "cost_usd": str(cost.total) if cost else None,
        "disconnected": call.disconnected,
        "served_by": call.served_by,
    }
    access_log.info(orjson.dumps(line).decode())

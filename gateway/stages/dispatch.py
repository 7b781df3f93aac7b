"""Routing as the pipeline runs it: choose a backend and send the call there, retrying
on another while nothing was sent to the client (``dispatch``); count it in and out of
the backend's load; teach the index what the backend holds (``remember`` at dispatch,
``learn`` at the end, with the backend's rates). The policy that weighs the backends
against each other is :mod:`gateway.stages.routing`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from gateway.answers import Answer
from gateway.backends import Backend, Model
from gateway.batching import owns_upstream
from gateway.flow import Call, PrefixKey, Route, Usage
from gateway.index import feedback
from gateway.stages import forward
from gateway.stages.costs import Rates
from gateway.stages.forward import Unreachable

if TYPE_CHECKING:
    from gateway.services import Services


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
        call.route = await choose(call, model, svc, exclude)
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


async def choose(call: Call, model: Model, svc: Services, exclude: set[str]) -> Route:
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


def occupy(backend: Backend, svc: Services, delta: int, call: Call) -> None:
    """Count a call into (1) or out of (-1) the backend's load and its in-flight gauge."""
    backend.in_flight += delta
    if delta > 0:
        backend.backlog.admit(call)
        svc.backends.admitted(backend)
    else:
        backend.backlog.release(call)
    if svc.settings.metrics_enabled:
        svc.metrics.count_in_flight(backend.name, delta)


def remember(call: Call, svc: Services) -> None:
    """The backend accepted the prompt: from now on it holds (or is computing) its prefix.

    Recorded at dispatch, not completion, so that concurrent calls sharing the prefix
    follow it there; the feedback from reported cached tokens corrects what was wrong.
    """
    if call.prefix is not None and call.prefix.hashes and call.route and call.request:
        svc.index.record(call.request.model, call.route.backend, call.prefix.hashes)


def release(call: Call, svc: Services) -> bool:
    """Count a finished call out of its backend's load; a stream that broke off after it
    began counts against the backend's circuit breaker. True when the call made its own
    upstream request: only such a call teaches the index and the rates (``learn``).
    """
    if call.route is None or call.dispatched_at is None or not owns_upstream(call):
        return False
    backend = svc.backends.backends[call.route.backend]
    occupy(backend, svc, -1, call)
    if call.status >= 500:
        svc.backends.failed(backend)
    return True


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
        holds=svc.prefix.reply_key(call.request, encoding, call.reply, key) if prefilled else None,
    )
    if fb.reported and not u.estimated:
        time_rates(call, key, route, u, svc.backends.backends[route.backend].backlog.rates)
    if fb.reported and not u.estimated and svc.settings.metrics_enabled:
        predicted = route.predicted_cached_tokens / max(key.tokens, 1)
        reported = u.cached_tokens / max(u.prompt_tokens, 1)
        m = svc.metrics
        m.add(m.child(m.prediction, call.request.model, accuracy(predicted, reported)), 1)


def time_rates(call: Call, key: PrefixKey, route: Route, u: Usage, rates: Rates) -> None:
    """Teach the backend's rates what the call cost: its report says what it prefilled,
    the relay's first byte how long that took, and its last byte how fast it decoded (an
    answer that came whole has no first byte apart from its decode, so it teaches only
    the shares).

    Only a call that was expected to find a sequence slot free teaches the TTFT fit: for
    one that waited, the error of the slot-wait estimate would land on the prefill rate,
    and it grows with the very queue the rate is fit on. An overestimated wait there makes
    queued tokens look free, which sends the backend more calls and a longer queue."""
    cached = min(u.cached_tokens / max(u.prompt_tokens, 1), 1.0)
    prefilled = key.tokens * (1 - cached)  # in the gateway's tokens, as the queue is
    rates.served(cached, prefilled, u.completion_tokens)
    if call.first_byte_at is None or call.dispatched_at is None:
        return
    waited = call.first_byte_at - call.dispatched_at
    if route.slot_wait == 0:
        rates.observe(route.queued_tokens + prefilled, route.running, waited)
    else:
        rates.waited(route.expected_ttft, waited)
    if call.done_at is not None and u.completion_tokens > 1:
        rates.decoded((call.done_at - call.first_byte_at) / (u.completion_tokens - 1))


def accuracy(predicted_share: float, reported_share: float) -> str:
    """Within 0.1 of the backend's cached share is accurate; otherwise over or under."""
    if abs(predicted_share - reported_share) <= 0.1:
        return "accurate"
    return "over" if predicted_share > reported_share else "under"

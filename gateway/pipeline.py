"""The order of the stages: the one place that knows how a call goes through the gateway.

A call's way (``handle``, ``send``): auth -> parse -> limits -> prefix -> batch, which
dispatches each upstream request (route, send, retry) -> the answer: a stream relayed as
it comes (``Stream``), a whole body read at once and sent (``Whole``).

A call's end (``finish``), the same for every call, answered or failed (an answer once
it is sent, an error before), in this order:
release its backend -> usage -> price -> ledger write -> settle limits -> index feedback
-> metrics -> access log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from gateway.answers import Answer, read_whole
from gateway.backends import Backend
from gateway.errors import GatewayError, InternalError, ShuttingDown
from gateway.flow import Call, Endpoint, Usage
from gateway.http_protocol import send_whole
from gateway.services import Services
from gateway.stages import auth, dispatch, forward, limits, parse, prefix, usage
from gateway.stages.relay import StreamRelay
from gateway.stages.sse import EventScanner

log = logging.getLogger(__name__)

OVERHEAD_HEADER = "x-gateway-overhead-ms"
GATEWAY_ID_HEADER = "x-gateway-request-id"


async def handle(
    call: Call, body: bytes, endpoint: Endpoint, svc: Services, receive: Receive
) -> Response:
    """Take a call from its raw body to the response the client gets.

    ``receive`` is the client connection's ASGI receive: while the call waits for its
    answer to begin, a client that disconnects cuts the wait (forward.ClientWatch).
    """
    try:
        backend, answer = await send(call, body, endpoint, svc, receive)
        headers = id_headers(call)
        headers["x-gateway-backend"] = backend.name
        headers.update(forward.passed_headers(answer))
        assert call.request is not None
        if call.request.stream:
            headers[OVERHEAD_HEADER] = milliseconds(overhead(call))
            return with_quota(call, Stream(call, answer, svc, headers))
        raw = await read_whole(answer)
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
    call.overhead = overhead(call)  # the client's wait, not the end's that follows it
    headers[OVERHEAD_HEADER] = milliseconds(call.overhead)
    return with_quota(call, Whole(call, svc, raw, headers))


async def send(
    call: Call, body: bytes, endpoint: Endpoint, svc: Services, receive: Receive
) -> tuple[Backend, Answer]:
    """The stages before the answer, in order, until the answer begins."""
    call.client_request_id = parse.client_request_id(call.headers)
    call.principal = auth.known(call.headers, svc.keys) or await auth.authenticate(
        call.headers, svc.keys
    )
    call.request = parse.parse(body, endpoint, call.headers.get("x-session-id"))
    auth.authorize_model(call.principal, call.request.model)
    model = svc.backends.model(call.request.model)
    if endpoint != "embeddings":
        call.prefix = svc.prefix.key(call.request, model.encoding)
    waiting = limits.admit(
        call, len(body), svc.limits, svc.plans, svc.settings.auth.ratelimit_headers
    )
    if waiting is not None:  # the shared store must answer (most calls need not wait)
        await waiting
    payload = forward.upstream_body(call.request, model.upstream_name, body)
    with svc.upstream.watch(call, receive):
        return await svc.batching.submit(
            call, model, payload, lambda c, body, pin: dispatch.dispatch(c, model, body, svc, pin)
        )


JSON = b"application/json"
SSE = b"text/event-stream; charset=utf-8"


class Whole(Response):
    """A whole JSON answer, then the call's end (``finish``) once it is sent."""

    def __init__(self, call: Call, svc: Services, body: bytes, headers: dict[str, str]) -> None:
        self.call = call
        self.svc = svc
        self.body = body
        self.status_code = 200
        self.background = None
        self.raw_headers = encoded(JSON, headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await then_end(self._send(scope, receive, send), partial(finish, self.call, self.svc))

    async def _send(self, scope: Scope, receive: Receive, send: Send) -> None:
        """In one write where the server allows it (``send_whole``), else by ASGI's send."""
        if not send_whole(scope, self.raw_headers, self.body):
            self.raw_headers.append((b"content-length", b"%d" % len(self.body)))
            await super().__call__(scope, receive, send)


async def then_end(sending: Awaitable[None], end: Callable[[], None]) -> None:
    """Send a response, then end the call (``end``): once the answer has left, so the
    client does not wait for the accounting; at once if sending failed.

    The server sends a turn's writes at the turn's end (:mod:`gateway.http_protocol`):
    the end is queued behind that send and runs right after it, before any call sent in
    answer to it has been read (a client's next call meets its spend settled). Queued,
    not awaited: another step of this task would cost every call more."""
    try:
        await sending
    except BaseException:
        end()
        raise
    asyncio.get_running_loop().call_soon(end)


def encoded(content_type: bytes, headers: dict[str, str]) -> list[tuple[bytes, bytes]]:
    """An answer's headers: the gateway's own and the backend's passed ones (lower-case
    names, latin-1 values), encoded as they are, without the checks of Starlette's
    generic encoding of a header dict: every call pays for them."""
    return [
        (b"content-type", content_type),
        *[(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
    ]


class Stream(StreamRelay):
    """A streamed answer: relayed to the client, then what the relay's scanner found
    becomes the call's usage and reply, then the call's end (``finish``), in that order."""

    def __init__(self, call: Call, answer: Answer, svc: Services, headers: dict[str, str]):
        request = call.request
        assert request is not None
        scanner = EventScanner(
            not request.include_usage,
            watch_tokens=request.endpoint == "responses",
            keep_text=prefix.learns_reply(request, call.prefix),
        )
        super().__init__(call, answer, scanner, encoded(SSE, headers))
        self.svc = svc

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await then_end(super().__call__(scope, receive, send), self._end)

    def _end(self) -> None:
        call, scanner = self.call, self.scanner
        call.usage = scanner.usage
        if scanner.keep_text or call.usage is None:  # else no one reads it
            call.reply, call.reply_share = scanner.reply(), scanner.reply_share
        finish(call, self.svc)


def finish(call: Call, svc: Services) -> None:
    """The end of every call, in order.

    What the backend reported is on the call already (read from the whole body or the
    stream). Never raises: the client's answer is already decided.
    """
    if call.done_at is None:
        call.done_at = time.perf_counter()
    own_upstream = dispatch.release(call, svc)  # out of its backend's load
    if call.usage is None:  # none reported: a disconnect, a stream that broke off
        call.usage = estimate_usage(call, svc)
    call.cost = svc.ledger.price(call)  # at the price in force when the call arrived
    svc.ledger.record(call, call.cost)
    limits.settle(call, call.cost, svc.limits)
    if own_upstream:  # a call that rode on another's upstream request teaches nothing
        dispatch.learn(call, svc)  # index feedback, and the backend's learned rates
    if call.overhead is None:
        call.overhead = overhead(call)
    if svc.settings.metrics_enabled:
        svc.metrics.observe(call, svc.backends.models)
    svc.access.write(call)


def failed(call: Call, svc: Services, exc: GatewayError) -> GatewayError:
    """Account for a call that ends in an error (ledger row, metrics, access line) and
    return the error to answer it with, marked with the call's id."""
    call.status, call.error_type = exc.status, exc.type
    exc.headers.update(id_headers(call))
    finish(call, svc)
    return exc


def estimate_usage(call: Call, svc: Services) -> Usage | None:
    """Count tokens ourselves when a backend had the call but its usage never came (a
    disconnect, a stream that broke off); None for a call no backend saw."""
    if call.route is None or (call.dispatched_at is None and not call.disconnected):
        return None
    assert call.request is not None
    encoding = svc.backends.model(call.request.model).encoding
    counted = svc.prefix.count_tokens(call.reply, encoding) if call.reply else 0
    return Usage(
        prompt_tokens=call.prefix.tokens if call.prefix else 0,
        completion_tokens=round(counted / call.reply_share),
        estimated=True,
    )


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

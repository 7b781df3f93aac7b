"""Send a call to its backend and wait until its answer begins; map every failure of the
HTTP client into a GatewayError (what the answer is read through: :mod:`gateway.answers`;
its relay to the client: :mod:`gateway.stages.relay`).

Calls reach the upstream HTTP client (:mod:`gateway.upstream`) through this module
alone; the registry's health and load probes (:mod:`gateway.backends`) use it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import orjson
from starlette.types import Receive

from gateway import upstream as http
from gateway.answers import Answer, Deliver, FixedAnswer
from gateway.backends import Backend, Cut
from gateway.errors import (
    BackendUnavailable,
    BadGateway,
    ClientClosedRequest,
    GatewayError,
    GatewayTimeout,
    UpstreamError,
)
from gateway.flow import ENDPOINTS, Call, Request
from gateway.metrics import GatewayMetrics
from gateway.settings import UpstreamSettings

UPSTREAM_PATH = {endpoint: path for path, endpoint in ENDPOINTS.items()}
"""The backend's path for each endpoint: the client's own (vLLM serves the same ones)."""
PASSED_HEADERS = ("x-backend-instance",)
"""Upstream response headers the client sees (the simulator names its instance)."""


class Unreachable(BackendUnavailable):
    """The backend refused the connection: it is down, and the call is safe to retry."""


CLIENT_ERRORS = (TimeoutError, http.ClientError)
"""What the HTTP client raises when a backend fails: ``failure`` maps each."""


def failure(exc: Exception, backend: str, begun: bool) -> GatewayError:
    """The gateway's error for a failure of the HTTP client, before the answer began (a
    refused connection is Unreachable, safe to retry) or while it was read."""
    kind = exc.__class__.__name__
    if isinstance(exc, TimeoutError):
        late = "stopped answering" if begun else "did not answer in time"
        return GatewayTimeout(f"backend {backend} {late}")
    if begun:
        return BadGateway(f"backend {backend} broke off its answer: {kind}")
    if isinstance(exc, http.ConnectError):
        return Unreachable(f"backend {backend} unreachable: {kind}")
    return BadGateway(f"backend {backend} failed: {kind}")


def retryable(exc: BaseException) -> bool:
    """A failure of the backend rather than of the call: another backend may answer it.

    A backend's 4xx is the call's own fault and would fail anywhere; a client that left
    (cancellation) wants no answer at all.
    """
    if isinstance(exc, UpstreamError):
        return exc.status >= 500
    return isinstance(exc, Unreachable | BadGateway | GatewayTimeout)


class Upstream:
    """One long-lived HTTP client for every backend call: a connection pool per backend."""

    def __init__(self, settings: UpstreamSettings, metrics: GatewayMetrics | None = None) -> None:
        """With metrics, the time to open each new connection is recorded per backend."""
        self._settings = settings
        self._metrics = metrics
        self._pools: dict[str, http.Pool] = {}
        """By backend URL, each opened at the backend's first call."""
        self._waiting: set[ClientWatch] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for pool in self._pools.values():
            await pool.aclose()

    def watch(self, call: Call, receive: Receive) -> ClientWatch:
        """A ClientWatch for the call's wait for its answer (``with``)."""
        return ClientWatch(call, receive, self._waiting)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(WATCH_AFTER)
            for watch in list(self._waiting):
                watch.swept()

    async def send(self, call: Call, backend: Backend, body: bytes) -> Answer:
        """POST the body and wait until there is something for the client: a stream's
        first chunk, a non-streamed answer whole. Until then a failure is safe to retry.

        The wait is bounded by ``first_byte_timeout`` (streams) or ``read_timeout`` (each
        silence of the backend), and cut short at once if the backend is ejected meanwhile
        (``Backend.waits``). A backend error status raises UpstreamError with its own body.
        """
        wait = Cut()
        backend.waits.add(wait)
        try:
            return await self._exchange(call, backend, body)
        except asyncio.CancelledError:
            if not wait.caught():
                raise
            raise GatewayTimeout(f"backend {backend.name} was taken out") from None
        except CLIENT_ERRORS as exc:
            raise failure(exc, backend.name, begun=False) from exc
        finally:
            backend.waits.discard(wait)

    async def _exchange(self, call: Call, backend: Backend, body: bytes) -> Answer:
        assert call.request is not None
        stream = call.request.stream
        headers = (("x-request-id", call.id),)
        timeout = self._settings.first_byte_timeout if stream else self._settings.read_timeout
        path = UPSTREAM_PATH[call.request.endpoint]
        resp = await self._pool(backend).request(path, body, headers, timeout)
        try:
            if resp.status >= 400:
                raw = await resp.read()
                raise UpstreamError(resp.status, raw, content_type(resp.headers))
            if stream:  # its first token's time is the relay's to note (stages/sse.py)
                return await self._begin(resp, backend)
            raw = await resp.read()
        except BaseException:
            resp.close()  # cut, not released: the backend sees the call abandoned and aborts it
            raise
        resp.release()
        return FixedAnswer(raw, resp.headers)

    def _pool(self, backend: Backend) -> http.Pool:
        pool = self._pools.get(backend.url)
        if pool is None:
            histogram = self._metrics.connect.labels(backend.name) if self._metrics else None
            headers = [("content-type", "application/json")]
            if backend.api_key:
                headers.append(("authorization", f"Bearer {backend.api_key}"))
            pool = self._pools[backend.url] = http.Pool(
                backend.url,
                headers=headers,
                limit=self._settings.max_connections,
                connect_timeout=self._settings.connect_timeout,
                on_connect=histogram.observe if histogram else None,
            )
        return pool

    async def _begin(self, resp: http.Response, backend: Backend) -> StreamAnswer:
        """Read a stream's first chunk, then bound the silences between the next ones."""
        first = await resp.chunk()
        if not first:
            raise http.ConnectionBroken("the stream ended before its first event")
        resp.expect(self._settings.idle_timeout)
        return StreamAnswer(resp, first, backend.name)


class StreamAnswer:
    """A stream whose first chunk has arrived, replayed before the rest (an Answer).

    The HTTP client's failures while the body is read become the gateway's own here: a
    silence past ``idle_timeout`` a GatewayTimeout, a body broken off a BadGateway.
    """

    __slots__ = ("_backend", "_first", "_resp", "headers")

    def __init__(self, resp: http.Response, first: bytes, backend: str) -> None:
        self._resp = resp
        self._first: bytes | None = first
        self._backend = backend
        self.headers: Mapping[str, str] = resp.headers

    def chunks(self) -> StreamAnswer:
        return self

    def __aiter__(self) -> StreamAnswer:
        return self

    async def __anext__(self) -> bytes:
        if self._first is not None:
            chunk, self._first = self._first, None
            return chunk
        try:
            chunk = await self._resp.chunk()
        except CLIENT_ERRORS as exc:
            raise failure(exc, self._backend, begun=True) from exc
        if not chunk:
            raise StopAsyncIteration
        return chunk

    async def pipe(self, deliver: Deliver) -> bool:
        """As ``chunks``, each piece handed to ``deliver`` as it arrives
        (``http.Response.pipe``): True at the end, False when ``deliver`` took no more."""
        if self._first is not None:
            chunk, self._first = self._first, None
            if not deliver(chunk):
                return False
        try:
            return await self._resp.pipe(deliver)
        except CLIENT_ERRORS as exc:
            raise failure(exc, self._backend, begun=True) from exc

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self])

    def release(self) -> None:
        self._resp.release()

    def close(self) -> None:
        self._resp.close()


WATCH_AFTER = 0.25
"""Seconds between sweeps of the calls waiting for their answer: one still waiting at two
sweeps in a row starts watching its client. An answer that comes sooner costs no watcher
task and no timer, and a client that leaves is noticed at most 0.5 s late."""


class ClientWatch:
    """Cuts the wait for an answer short when the client disconnects: the upstream request
    is abandoned (vLLM aborts it) and ClientClosedRequest (499) is raised.

    For the time before anything is sent to the client; once a stream's headers are out,
    StreamRelay watches. The call's own task is cancelled (a Cut), so it unwinds through
    every stage as from a timeout, and each shield keeps its meaning (a coalesced call's
    leader leaving frees its followers). Made by ``Upstream.watch``, whose sweeper starts
    the watcher task of a wait that lasts (a timer per call would cost more than all the
    rest of this together).
    """

    __slots__ = ("_call", "_cut", "_receive", "_sweeps", "_task", "_waiting")

    def __init__(self, call: Call, receive: Receive, waiting: set[ClientWatch]) -> None:
        self._call = call
        self._receive = receive
        self._waiting = waiting
        self._sweeps = 0
        self._task: asyncio.Task[None] | None = None
        self._cut: Cut | None = None

    def __enter__(self) -> None:
        self._cut = Cut()
        self._waiting.add(self)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        cut, self._cut = self._cut, None
        self._waiting.discard(self)
        if self._task is not None:
            self._task.cancel()
        if exc_type is asyncio.CancelledError and cut is not None and cut.caught():
            raise ClientClosedRequest("the client disconnected before its answer began") from None

    def swept(self) -> None:
        self._sweeps += 1
        if self._sweeps == 2:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        if self._cut is not None:
            self._call.disconnected = True
            self._cut.cut("client left")


def upstream_body(request: Request, upstream_model: str, raw: bytes) -> bytes:
    """The body to send upstream: the client's bytes unless the gateway must change them.

    Streams always ask for usage (the ledger needs it), and a model served under another
    name upstream is renamed.
    """
    rename = upstream_model != request.model
    if not rename and (not request.stream or request.include_usage):
        return raw
    body: dict[str, Any] = dict(request.body)
    if rename:
        body["model"] = upstream_model
    if request.stream and not request.include_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body["stream_options"] = options
    return orjson.dumps(body)


def content_type(headers: Mapping[str, str]) -> str:
    """The media type of an answer (its parameters left off), JSON if it names none."""
    return headers.get("content-type", "").partition(";")[0].strip() or "application/json"


def passed_headers(answer: Answer) -> dict[str, str]:
    return {h: v for h in PASSED_HEADERS if (v := answer.headers.get(h)) is not None}

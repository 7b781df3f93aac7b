"""Send a call to its backend and wait until its answer begins; map every failure of the
HTTP client into a GatewayError (what the answer is read through: :mod:`gateway.answers`;
its relay to the client: :mod:`gateway.stages.relay`).

This is the only module that knows the upstream HTTP client. aiohttp, not httpx: side by
side against one server, aiohttp's ClientSession makes many times the calls per second of
httpx's AsyncClient, at a fraction of its latency.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from types import TracebackType
from typing import Any

import aiohttp
import orjson
from starlette.types import Receive
from yarl import URL

from gateway.answers import Answer, FixedAnswer
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


CLIENT_ERRORS = (TimeoutError, aiohttp.ClientError)
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
    if isinstance(exc, aiohttp.ClientConnectorError):
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
    """One long-lived, pooled HTTP client for every backend call."""

    def __init__(self, settings: UpstreamSettings, metrics: GatewayMetrics | None = None) -> None:
        """With metrics, the time to open each new connection is recorded per backend."""
        self._settings = settings
        self._metrics = metrics
        self._names: dict[tuple[str | None, int | None], str] = {}
        """Backend name by (host, port), for the connect-time label."""
        self._urls: set[str] = set()
        self._session: aiohttp.ClientSession | None = None
        self._waiting: set[ClientWatch] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        s = self._settings
        # aiohttp's read timeout bounds each silence (restarted by every chunk): for a
        # non-streamed call, whose answer comes whole, the wait for it; for a stream, the
        # wait for its first event after the headers, then (``_begin``) between chunks.
        self._whole = aiohttp.ClientTimeout(
            sock_connect=s.connect_timeout, sock_read=s.read_timeout
        )
        self._stream = aiohttp.ClientTimeout(
            sock_connect=s.connect_timeout, sock_read=s.first_byte_timeout
        )
        self._session = aiohttp.ClientSession(
            connector=TimedConnector(
                self._metrics, self._names, limit=s.max_connections, limit_per_host=0
            )
            if self._metrics
            else aiohttp.TCPConnector(limit=s.max_connections, limit_per_host=0),
            timeout=self._whole,
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
        )
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())

    async def aclose(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

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

        The wait is bounded by ``first_byte_timeout`` (streams) or ``read_timeout``, and
        cut short at once if the backend is ejected meanwhile (``Backend.waits``). A
        backend error status raises UpstreamError with its own body.
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
        assert self._session is not None
        assert call.request is not None
        stream = call.request.stream
        headers = {"content-type": "application/json", "x-request-id": call.id}
        if backend.api_key:
            headers["authorization"] = f"Bearer {backend.api_key}"
        url = backend.url + UPSTREAM_PATH[call.request.endpoint]
        if backend.url not in self._urls:
            self._urls.add(backend.url)
            origin = URL(backend.url)
            self._names[origin.host, origin.port] = backend.name
        timeout = self._stream if stream else self._whole
        resp = await self._session.post(url, data=body, headers=headers, timeout=timeout)
        try:
            if resp.status >= 400:
                raw = await resp.read()
                raise UpstreamError(resp.status, raw, resp.content_type or "application/json")
            if stream:  # its first token's time is the relay's to note (stages/sse.py)
                return await self._begin(resp, backend)
            raw = await resp.read()
        except BaseException:
            resp.close()  # cut, not released: the backend sees the call abandoned and aborts it
            raise
        resp.release()
        return FixedAnswer(raw, resp.headers)

    async def _begin(self, resp: aiohttp.ClientResponse, backend: Backend) -> StreamAnswer:
        """Read a stream's first chunk, then bound the silences between the next ones."""
        first = await resp.content.readany()
        if not first:
            raise aiohttp.ClientPayloadError("the stream ended before its first event")
        if resp.connection is not None:
            protocol = resp.connection.protocol
            if protocol is not None:
                # aiohttp's own read timeout, restarted by every chunk that arrives.
                protocol.read_timeout = self._settings.idle_timeout
                protocol.start_timeout()
        return StreamAnswer(resp, first, backend.name)


class StreamAnswer:
    """A stream whose first chunk has arrived, replayed before the rest (an Answer).

    The HTTP client's failures while the body is read become the gateway's own here: a
    silence past ``idle_timeout`` a GatewayTimeout, a body broken off a BadGateway.
    """

    __slots__ = ("_backend", "_first", "_resp", "headers")

    def __init__(self, resp: aiohttp.ClientResponse, first: bytes, backend: str) -> None:
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
            chunk = await self._resp.content.readany()
        except CLIENT_ERRORS as exc:
            raise failure(exc, self._backend, begun=True) from exc
        if not chunk:
            raise StopAsyncIteration
        return chunk

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


class TimedConnector(aiohttp.TCPConnector):
    """A TCPConnector that times the opening of each new connection to a backend.

    Not an aiohttp TraceConfig: with any trace config set, aiohttp builds a Trace and
    sends every signal on every request, a cost paid by every call. This hook runs only
    when a connection is opened, so reused connections cost nothing.
    """

    def __init__(
        self,
        metrics: GatewayMetrics,
        names: dict[tuple[str | None, int | None], str],
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._histogram = metrics.connect
        self._names = names

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:  # noqa: ASYNC109
        started = time.perf_counter()
        protocol = await super()._create_connection(req, traces, timeout)
        backend = self._names.get((req.url.host, req.url.port), "")
        self._histogram.labels(backend).observe(time.perf_counter() - started)
        return protocol


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


def passed_headers(answer: Answer) -> dict[str, str]:
    return {h: v for h in PASSED_HEADERS if (v := answer.headers.get(h)) is not None}

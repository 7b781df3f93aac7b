import asyncio
import contextlib
from collections.abc import AsyncIterator
from types import SimpleNamespace

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http_protocol import (
    CYCLE,
    CoalescingHttpTools,
    CoalescingTransport,
    send_whole,
    start_chunked,
)
from tests.conftest import free_port
from tests.polling import eventually


class Recorded(asyncio.Transport):
    """A transport that keeps what is sent, one entry per send."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.sent.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 8080) if name == "sockname" else default


async def test_writes_of_one_turn_leave_as_one_send_in_order() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"body")
    assert inner.sent == []
    await asyncio.sleep(0)
    assert inner.sent == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
    transport.write(b"more")
    await asyncio.sleep(0)
    assert inner.sent[1:] == [b"more"]


async def test_close_sends_what_is_pending_first_and_a_closed_transport_gets_nothing() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write(b"last words")
    transport.close()
    assert inner.sent == [b"last words"]
    assert inner.closed
    transport.write(b"after close")
    await asyncio.sleep(0)
    assert inner.sent == [b"last words"]


async def test_everything_else_is_the_transports_own() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    assert transport.get_extra_info("sockname") == ("127.0.0.1", 8080)
    assert transport.is_closing() is False


async def test_write_now_sends_at_once_after_what_is_pending() -> None:
    inner = Recorded()
    transport = CoalescingTransport(inner, asyncio.get_running_loop())
    transport.write_now(b"piece")
    assert inner.sent == [b"piece"]  # not held to the turn's end
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write_now(b"first")
    assert inner.sent[1:] == [b"HTTP/1.1 200 OK\r\n\r\nfirst"]  # in order, one send
    await asyncio.sleep(0)
    assert len(inner.sent) == 2  # the turn's end finds nothing left to send
    transport.close()
    transport.write_now(b"after close")
    assert len(inner.sent) == 2


HEAD = [(b"content-type", b"application/json"), (b"x-gateway-backend", b"b1")]
BODY = b'{"ok": true}'


async def whole_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers every request with send_whole where it can, and says when it could not."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    if scope["path"] == "/stream":
        writer = start_chunked(scope, HEAD)
        assert writer is not None
        for piece in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(piece)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    elif not send_whole(scope, HEAD, BODY):
        headers = [*HEAD, (b"x-sent-by", b"asgi"), (b"content-length", b"%d" % len(BODY))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": BODY})


@contextlib.asynccontextmanager
async def serving(app: ASGIApp) -> AsyncIterator[int]:
    """``app`` under uvicorn with the gateway's protocol, as ``gateway serve`` runs it."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, http=CoalescingHttpTools,
                            lifespan="off", log_level="warning", server_header=False)  # fmt: skip
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await eventually(lambda: server.started)
    try:
        yield port
    finally:
        server.should_exit = True
        await task


async def read_head(reader: asyncio.StreamReader) -> list[bytes]:
    """The status line and header lines of the next response."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    return head.split(b"\r\n")[:-2]


def header_names(lines: list[bytes]) -> list[bytes]:
    return [ln.partition(b": ")[0] for ln in lines[1:]]


async def read_response(reader: asyncio.StreamReader) -> tuple[list[bytes], bytes]:
    lines = await read_head(reader)
    length = next(
        int(v) for n, _, v in (ln.partition(b": ") for ln in lines) if n == b"content-length"
    )
    return lines, await reader.readexactly(length)


POST = b"POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\n%b\r\n{}"


async def test_a_whole_answer_has_the_servers_headers_and_lets_a_pipelined_call_go() -> None:
    async with serving(whole_app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(POST % b"" + POST % b"")  # pipelined: the second waits for the first
        for _ in range(2):
            lines, body = await read_response(reader)
            assert lines[0] == b"HTTP/1.1 200 OK"
            names = header_names(lines)
            assert names == [b"date", b"content-type", b"x-gateway-backend", b"content-length"]
            assert body == BODY
        writer.close()


async def test_a_client_that_asks_to_close_is_told_so_and_the_connection_closes() -> None:
    async with serving(whole_app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(POST % b"connection: close\r\n")
        lines, body = await read_response(reader)
        assert b"connection: close" in lines
        assert body == BODY
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        writer.close()


async def test_without_the_gateways_server_or_with_a_paused_client_asgi_sends() -> None:
    assert send_whole({"type": "http", "extensions": {}}, HEAD, BODY) is False
    paused = SimpleNamespace(
        response_started=False, disconnected=False, flow=SimpleNamespace(write_paused=True)
    )
    assert send_whole({"extensions": {CYCLE: {"cycle": paused}}}, HEAD, BODY) is False
    assert paused.response_started is False  # left wholly to ASGI's send


async def test_a_streamed_answers_head_and_pieces_go_out_and_its_end_completes_it() -> None:
    async with serving(whole_app) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        stream = POST.replace(b"/v1/chat/completions", b"/stream") % b""
        writer.write(stream + POST % b"")  # the second waits for the stream's end
        lines = await read_head(reader)
        assert lines[0] == b"HTTP/1.1 200 OK"
        names = header_names(lines)
        assert names == [b"date", b"content-type", b"x-gateway-backend", b"transfer-encoding"]
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
        assert body == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        lines, whole = await read_response(reader)
        assert (lines[0], whole) == (b"HTTP/1.1 200 OK", BODY)
        writer.close()

"""The upstream HTTP client against real sockets: raw loopback servers that answer well or
badly on purpose, and the simulator."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import orjson
import pytest

from gateway.sim.config import SimConfig
from gateway.sim.server import start_simulator
from gateway.upstream import ConnectError, ConnectionBroken, Pool, ProtocolError, Response
from tests.conftest import free_port
from tests.polling import eventually

HEADERS = [("content-type", "application/json"), ("x-request-id", "r1")]


@dataclass
class Server:
    """A loopback server; ``answer`` writes the reply to each request on a connection."""

    url: str = ""
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    heads: list[bytes] = field(default_factory=list)
    left: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the client closed a connection on which a request awaited its answer."""


Answer = Callable[[asyncio.StreamWriter, asyncio.StreamReader, Server], Awaitable[bool]]
"""Writes one reply; False closes the connection afterwards."""


@asynccontextmanager
async def server(answer: Answer) -> AsyncIterator[Server]:
    s = Server()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        s.connections += 1
        s.open_now += 1
        s.most_open = max(s.most_open, s.open_now)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                s.heads.append(head)
                if not await answer(writer, reader, s):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            s.open_now -= 1
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    s.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
    try:
        yield s
    finally:
        srv.close()


def pool(url: str, limit: int = 10) -> Pool:
    return Pool(url, limit=limit, connect_timeout=2)


def whole(body: bytes, status: int = 200) -> bytes:
    return b"HTTP/1.1 %d OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        len(body),
        body,
    )


async def ok(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
    writer.write(whole(b'{"n":%d}' % len(s.heads)))
    return True


async def test_a_whole_answer_and_the_connection_reused() -> None:
    async with server(ok) as s:
        p = Pool(s.url + "/base/", headers=[("authorization", "Bearer k")], limit=1,
                 connect_timeout=2)  # fmt: skip
        for n in (1, 2, 3):
            resp = await p.request("/v1/x", b"{}", HEADERS, 5)
            assert (resp.status, resp.headers["content-type"]) == (200, "application/json")
            assert await resp.read() == b'{"n":%d}' % n
            resp.release()
        await p.aclose()
    assert s.connections == 1
    assert s.heads[0].startswith(b"POST /base/v1/x HTTP/1.1\r\nhost: 127.0.0.1:")
    assert b"host: 127.0.0.1:" in s.heads[0]
    assert b"authorization: Bearer k\r\ncontent-type: application/json\r\n" in s.heads[0]
    assert s.heads[0].endswith(b"content-length: 2\r\n\r\n")


async def test_a_chunked_stream_arrives_chunk_by_chunk() -> None:
    go_on = asyncio.Event()

    async def stream(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        return True

    async with server(stream) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        assert await resp.chunk() == b"first"  # before the backend sent the rest
        go_on.set()
        assert await resp.read() == b"second"
        assert resp.complete
        resp.release()
        again = await p.request("/", b"{}", HEADERS, 5)
        assert await again.read() == b"firstsecond"
        again.release()
        await p.aclose()
    assert s.connections == 1


def taking(got: list[bytes]) -> Callable[[bytes], bool]:
    """A pipe's reader that takes every piece, into ``got``."""

    def deliver(piece: bytes) -> bool:
        got.append(piece)
        return True

    return deliver


async def test_a_piped_stream_is_delivered_as_it_arrives_and_held_while_refused() -> None:
    gates = [asyncio.Event(), asyncio.Event()]

    async def stream(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await gates[0].wait()
        writer.write(b"6\r\nsecond\r\n")
        await writer.drain()
        await gates[1].wait()
        writer.write(b"5\r\nthird\r\n0\r\n\r\n")
        return True

    got: list[bytes] = []

    def refuse_after_second(piece: bytes) -> bool:
        got.append(piece)
        return piece != b"second"

    async with server(stream) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        piping = asyncio.create_task(resp.pipe(refuse_after_second))
        await eventually(lambda: got == [b"first"])  # delivered while the pipe still waits
        assert not piping.done()
        gates[0].set()
        assert await asyncio.wait_for(piping, 5) is False  # refused: the pipe stops
        gates[1].set()
        await asyncio.sleep(0.05)
        assert got == [b"first", b"second"]  # what came meanwhile is held, not delivered
        assert await resp.pipe(taking(got)) is True
        assert got == [b"first", b"second", b"third"]
        assert resp.complete
        resp.release()
        again = await p.request("/", b"{}", HEADERS, 5)  # the connection is reused
        assert await again.read() == b"firstsecondthird"
        again.release()
        await p.aclose()
    assert s.connections == 1


async def test_a_piped_stream_broken_midway_raises_to_its_reader() -> None:
    got: list[bytes] = []
    exc = await broken(MIDWAY, lambda resp: resp.pipe(taking(got)))
    assert isinstance(exc, ConnectionBroken)
    assert got == [b"first"]


def raising(piece: bytes) -> bool:
    """A pipe's reader that fails on the first piece it is given."""
    raise ValueError(piece)


async def test_a_reader_raising_on_what_arrived_before_the_pipe_is_raised_to_it() -> None:
    async with server(first_chunk_then_silence) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        await eventually(lambda: resp.heard)
        await asyncio.sleep(0.05)  # the first chunk is in: the pipe delivers it at once
        with pytest.raises(ValueError, match="first"):
            await resp.pipe(raising)
        resp.close()
        await p.aclose()


async def test_a_reader_raising_in_the_connections_callback_is_raised_to_it() -> None:
    go_on = asyncio.Event()

    async def answer(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, s: Server) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await go_on.wait()
        writer.write(b"5\r\nfirst\r\n")
        await writer.drain()
        await reader.read()
        s.left.set()
        return False

    async with server(answer) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        piping = asyncio.create_task(resp.pipe(raising))
        await asyncio.sleep(0.05)
        go_on.set()
        with pytest.raises(ValueError, match="first"):
            await asyncio.wait_for(piping, 5)
        await asyncio.wait_for(s.left.wait(), 5)  # closed: the backend sees the call end
        resp.close()
        await p.aclose()


async def test_a_body_ended_by_the_connection_closing_is_whole() -> None:
    async def until_close(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")
        return False

    async with server(until_close) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        assert await resp.read() == b"all of it"
        resp.release()
        await p.aclose()


async def broken(
    reply: bytes, read: Callable[[Response], Awaitable[object]] = Response.read
) -> BaseException:
    """What reading (``read``) an answer that is ``reply`` and then a closed connection
    raises."""

    async def answer(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(reply)
        return False

    async with server(answer) as s:
        p = pool(s.url)
        try:
            resp = await p.request("/", b"{}", HEADERS, 5)
            try:
                await read(resp)
            finally:
                resp.close()
        except Exception as exc:
            return exc
        finally:
            await p.aclose()
    raise AssertionError("no error")


async def test_a_truncated_body_is_a_broken_connection() -> None:
    exc = await broken(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
    assert isinstance(exc, ConnectionBroken)


MIDWAY = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"
"""A stream's head and first chunk, then nothing: the connection closes."""


async def test_a_stream_closed_midway_is_a_broken_connection() -> None:
    exc = await broken(MIDWAY)
    assert isinstance(exc, ConnectionBroken)


async def test_a_connection_closed_before_any_answer_is_a_broken_connection() -> None:
    assert isinstance(await broken(b""), ConnectionBroken)


@pytest.mark.parametrize(
    "reply",
    [
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nfirst\r\n",  # size not hex
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nfirst\r\n",  # longer than said
        b"SMTP ready\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad header line\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\nabc",
    ],
)
async def test_malformed_answers_are_protocol_errors(reply: bytes) -> None:
    assert isinstance(await broken(reply), ProtocolError)


async def test_slow_headers_time_out() -> None:
    async def silent(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, s: Server) -> bool:
        await reader.read()  # until the client gives up
        s.left.set()
        return False

    async with server(silent) as s:
        p = pool(s.url)
        with pytest.raises(TimeoutError):
            await p.request("/", b"{}", HEADERS, 0.2)
        await asyncio.wait_for(s.left.wait(), 5)  # the connection was closed: vLLM aborts
        await p.aclose()


async def first_chunk_then_silence(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, s: Server
) -> bool:
    """A backend that sends one chunk of a stream, then nothing until the gateway leaves."""
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
    await writer.drain()
    await reader.read()
    s.left.set()
    return False


async def test_a_stream_silent_past_its_idle_bound_times_out_and_is_closed() -> None:
    async with server(first_chunk_then_silence) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        assert await resp.chunk() == b"first"
        resp.expect(0.2)
        with pytest.raises(TimeoutError):
            await resp.chunk()
        resp.close()
        await asyncio.wait_for(s.left.wait(), 5)
        await p.aclose()


async def test_closing_an_answer_closes_its_connection_for_the_backend() -> None:
    async with server(first_chunk_then_silence) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        resp.close()
        await asyncio.wait_for(s.left.wait(), 5)
        await p.aclose()


async def test_a_refused_connection_is_a_connect_error() -> None:
    p = pool(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConnectError):
        await p.request("/", b"{}", HEADERS, 5)
    await p.aclose()


async def test_a_kept_connection_the_backend_closed_is_replaced_by_a_new_one() -> None:
    async def once(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(whole(b"{}"))
        return False  # answers, then closes, as a server whose keep-alive ran out

    async with server(once) as s:
        p = pool(s.url)
        for _ in range(3):
            resp = await p.request("/", b"{}", HEADERS, 5)
            assert await resp.read() == b"{}"
            resp.release()
            await asyncio.sleep(0.05)  # the close reaches the idle connection
        await p.aclose()
    assert s.connections == 3


async def test_a_request_on_a_kept_connection_closed_unseen_is_sent_again() -> None:
    """The backend closes a kept connection just as a request goes out on it."""

    async def close_kept(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        if len(s.heads) == 2:  # the second request, on the kept connection: dropped unread
            return False
        writer.write(whole(b"{}"))
        return True

    async with server(close_kept) as s:
        p = pool(s.url)
        for _ in range(2):
            resp = await p.request("/", b"{}", HEADERS, 5)
            assert await resp.read() == b"{}"
            resp.release()
        await p.aclose()
    assert s.connections == 2


async def test_an_answer_to_no_request_spoils_the_connection() -> None:
    async def extra(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(whole(b"{}") + whole(b"unasked"))
        return True

    async with server(extra) as s:
        p = pool(s.url)
        for _ in range(2):
            resp = await p.request("/", b"{}", HEADERS, 5)
            assert await resp.read() == b"{}"
            resp.release()
            await asyncio.sleep(0.05)
        await p.aclose()
    assert s.connections == 2


async def test_an_informational_answer_is_passed_over() -> None:
    async def early(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n" + whole(b"{}", 201))
        return True

    async with server(early) as s:
        p = pool(s.url)
        resp = await p.request("/", b"{}", HEADERS, 5)
        assert (resp.status, await resp.read()) == (201, b"{}")
        resp.release()
        await p.aclose()


async def test_at_the_limit_requests_wait_for_a_connection() -> None:
    async def slow(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        await asyncio.sleep(0.02)
        writer.write(whole(b"{}"))
        return True

    async def one(p: Pool) -> bytes:
        resp = await p.request("/", b"{}", HEADERS, 5)
        try:
            return await resp.read()
        finally:
            resp.release()

    async with server(slow) as s:
        p = pool(s.url, limit=2)
        assert await asyncio.gather(*(one(p) for _ in range(8))) == [b"{}"] * 8
        await p.aclose()
    assert s.most_open <= 2


async def test_a_waiter_cancelled_passes_its_turn_on() -> None:
    async def slow(writer: asyncio.StreamWriter, _: asyncio.StreamReader, s: Server) -> bool:
        await asyncio.sleep(0.05)
        writer.write(whole(b"{}"))
        return True

    async with server(slow) as s:
        p = pool(s.url, limit=1)
        first = asyncio.ensure_future(p.request("/", b"{}", HEADERS, 5))
        await asyncio.sleep(0.01)
        gone = asyncio.ensure_future(p.request("/", b"{}", HEADERS, 5))
        last = asyncio.ensure_future(p.request("/", b"{}", HEADERS, 5))
        await asyncio.sleep(0.01)
        gone.cancel()
        resp = await first
        await resp.read()
        resp.release()
        resp = await asyncio.wait_for(last, 5)
        assert await resp.read() == b"{}"
        resp.release()
        await p.aclose()


async def test_a_header_carrying_a_line_break_is_refused() -> None:
    p = pool("http://127.0.0.1:1")
    with pytest.raises(ValueError, match="line break"):
        await p.request("/", b"{}", [("x-request-id", "a\r\nx-admin: yes")], 5)
    with pytest.raises(ValueError, match="line break"):
        Pool("http://h", headers=[("authorization", "k\nx: y")], limit=1, connect_timeout=1)


async def test_calls_to_the_simulator_whole_and_streamed() -> None:
    sim = await start_simulator(SimConfig(model="m", instant=True), port=0)
    try:
        p = pool(sim.url)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
        resp = await p.request("/v1/chat/completions", orjson.dumps(body), HEADERS, 5)
        answer = orjson.loads(await resp.read())
        resp.release()
        assert answer["usage"]["completion_tokens"] == 5
        streamed = {**body, "stream": True, "stream_options": {"include_usage": True}}
        resp = await p.request("/v1/chat/completions", orjson.dumps(streamed), HEADERS, 5)
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = (await resp.read()).split(b"\n\n")
        resp.release()
        assert events[-2] == b"data: [DONE]"
        assert b'"completion_tokens":5' in events[-3]
        await p.aclose()
    finally:
        await sim.aclose()

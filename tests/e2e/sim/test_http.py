"""The simulator's own HTTP/1.1 server, spoken to over raw sockets."""

from __future__ import annotations

import asyncio
import socket

from gateway.sim.http import Connection, Request, Response, Result
from tests.e2e.sim.conftest import StartSim

CHAT = b'{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2}'


def post(path: bytes, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %b HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n%b\r\n%b" % (
        path,
        len(body),
        extra,
        body,
    )


async def read_response(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    status = await reader.readline()
    headers: dict[bytes, bytes] = {}
    while (line := await reader.readline()) != b"\r\n":
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers[b"content-length"]))
    return status, headers, body


async def test_pipelined_requests_are_answered_in_order(start_sim: StartSim) -> None:
    sim = await start_sim(step_ms=1.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    writer.write(
        post(b"/v1/chat/completions", CHAT) + b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n"
    )
    first = await asyncio.wait_for(read_response(reader), 5)
    second = await asyncio.wait_for(read_response(reader), 5)
    writer.close()
    assert first[0].startswith(b"HTTP/1.1 200")
    assert b"chat.completion" in first[2]
    assert b'"object":"list"' in second[2]
    assert first[1][b"x-backend-instance"] == sim.name.encode()


async def test_expect_continue_and_chunked_request_bodies(start_sim: StartSim) -> None:
    sim = await start_sim(instant=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    half = len(CHAT) // 2
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    assert await asyncio.wait_for(reader.readline(), 5) == b"HTTP/1.1 100 Continue\r\n"
    assert await reader.readline() == b"\r\n"
    for part in (CHAT[:half], CHAT[half:]):
        writer.write(b"%x\r\n%b\r\n" % (len(part), part))
    writer.write(b"0\r\n\r\n")
    status, _, body = await asyncio.wait_for(read_response(reader), 5)
    writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    assert b'"completion_tokens":2' in body


async def test_connection_close_and_http_1_0_hang_up_after_the_answer(start_sim: StartSim) -> None:
    sim = await start_sim(instant=True)
    for request in (
        post(b"/v1/chat/completions", CHAT, b"connection: close\r\n"),
        b"GET /health HTTP/1.0\r\n\r\n",
    ):
        reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
        writer.write(request)
        status, headers, _ = await asyncio.wait_for(read_response(reader), 5)
        assert status.split()[1] == b"200"
        assert headers[b"connection"] == b"close"
        assert await asyncio.wait_for(reader.read(), 5) == b""
        writer.close()


async def test_unknown_paths_methods_and_garbage(start_sim: StartSim) -> None:
    sim = await start_sim(instant=True)
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    writer.write(
        b"GET /nope HTTP/1.1\r\nhost: x\r\n\r\nGET /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n"
    )
    missing = await asyncio.wait_for(read_response(reader), 5)
    wrong = await asyncio.wait_for(read_response(reader), 5)
    assert missing[0].split()[1] == b"404"
    assert wrong[0].split()[1] == b"405"
    writer.write(b"NOT HTTP AT ALL\r\n\r\n")
    garbage = await asyncio.wait_for(read_response(reader), 5)
    assert garbage[0].split()[1] == b"400"
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()


async def test_a_streamed_answer_is_chunked_server_sent_events(start_sim: StartSim) -> None:
    sim = await start_sim(step_ms=1.0)
    reader, writer = await asyncio.open_connection("127.0.0.1", sim.port)
    body = CHAT[:-1] + b',"stream":true}'
    writer.write(post(b"/v1/chat/completions", body, b"connection: close\r\n"))
    raw = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    head, _, chunked = raw.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head
    assert b"content-type: text/event-stream" in head
    events = b""
    while True:
        size_line, _, rest = chunked.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        events, chunked = events + rest[:size], rest[size + 2 :]
    lines = [e for e in events.split(b"\n\n") if e]
    assert lines[-1] == b"data: [DONE]"
    assert len(lines) == 1 + 2 + 1  # role, two tokens, [DONE]


async def test_a_failing_handler_gets_a_500_and_the_connection_closes() -> None:
    async def later(request: Request) -> Response:
        raise RuntimeError("boom")

    def dispatch(request: Request) -> Result:
        if request.path == "/sync":
            raise RuntimeError("boom")
        return later(request)

    loop = asyncio.get_running_loop()
    live: set[Connection] = set()
    server = await loop.create_server(lambda: Connection(dispatch, b"", live), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for path in (b"/sync", b"/async"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET %b HTTP/1.1\r\nhost: x\r\n\r\n" % path)
            status, _, _ = await asyncio.wait_for(read_response(reader), 5)
            assert status.split()[1] == b"500"
            assert await asyncio.wait_for(reader.read(), 5) == b""
            writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_accepted_sockets_send_small_writes_at_once() -> None:
    """TCP_NODELAY: without it a reused connection's streamed tokens wait ~40 ms each."""
    loop = asyncio.get_running_loop()
    live: set[Connection] = set()
    # A socket made as start_simulator makes it (proto 0), for which asyncio itself
    # does not set TCP_NODELAY on accepted connections.
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    server = await loop.create_server(
        lambda: Connection(lambda r: Response(200, b""), b"", live), sock=listening
    )
    port = listening.getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.wait_for(read_response(reader), 5)
    try:
        (conn,) = live
        sock = conn.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    finally:
        writer.close()
        server.close()
        await server.wait_closed()

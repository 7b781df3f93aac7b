"""HTTP/1.1 over a bare socket: the request's bytes exactly as written, however wrong."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass

Headers = tuple[tuple[bytes, bytes], ...]
EXPECT_OVER = 64 * 1024


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes


def request(
    port: int,
    path: str,
    body: bytes,
    headers: Headers = (),
    *,
    method: str = "POST",
    content_length: bool = True,
    timeout: float = 30,
) -> Answer:
    """Send one request on a new connection and read the whole answer.

    A body of ``EXPECT_OVER`` bytes or more is sent as HTTP/1.1 clients send large bodies,
    after ``Expect: 100-continue`` is answered: a server that refuses the request by its
    declared length answers at once and closes, and a body still being sent then would
    meet a reset instead of the answer.
    """
    expect = content_length and len(body) >= EXPECT_OVER
    head = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    if content_length:
        head.append(b"Content-Length: " + str(len(body)).encode())
    if expect:
        head.append(b"Expect: 100-continue")
    head += [name + b": " + value for name, value in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + (b"" if expect else body))
        if expect and continued(sock):
            sock.sendall(body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)


def continued(sock: socket.socket) -> bool:
    """Wait for the server's first answer; consume it and say True if it is 100 Continue,
    else leave it unread (it is the final answer) and say False."""
    first = sock.recv(64, socket.MSG_PEEK)
    if not first.startswith(b"HTTP/1.1 100"):
        return False
    seen = b""
    while not seen.endswith(b"\r\n\r\n"):
        seen += sock.recv(1)
    return True

"""HTTP/1.1 over a bare socket: the request's bytes exactly as written, however wrong."""

from __future__ import annotations

import http.client
import socket
from dataclasses import dataclass

Headers = tuple[tuple[bytes, bytes], ...]


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
    """Send one request on a new connection and read the whole answer."""
    head = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1", b"Connection: close"]
    if content_length:
        head.append(b"Content-Length: " + str(len(body)).encode())
    head += [name + b": " + value for name, value in headers]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(b"\r\n".join(head) + b"\r\n\r\n" + body)
        response = http.client.HTTPResponse(sock)
        response.begin()
        data = response.read()
        return Answer(response.status, {k.lower(): v for k, v in response.getheaders()}, data)

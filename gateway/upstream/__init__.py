"""The HTTP/1.1 client the gateway sends its calls to the backends with, and probes their
health and load with: a keep-alive pool per backend (:mod:`.pool`) of asyncio connections
whose answers httptools parses (:mod:`.connection`).

Its own rather than aiohttp's ClientSession: aiohttp builds a request object, a response
object, a stream reader, header multidicts, URL objects and timers for every call, a
large share of the gateway's CPU per call. This client does per call what a call needs
(one head written, one answer object, no timer on a reused connection) and keeps what
aiohttp gave: connect and read timeouts, a bound on connections, keep-alive, chunked and
Content-Length bodies, back-pressure, and closing a connection to abort its request.
httptools is llhttp (Node.js's parser), already here as uvicorn's parser.
"""

from gateway.upstream.connection import (
    ClientError,
    ConnectError,
    ConnectionBroken,
    ProtocolError,
    Response,
)
from gateway.upstream.pool import Pool

__all__ = ["ClientError", "ConnectError", "ConnectionBroken", "Pool", "ProtocolError", "Response"]

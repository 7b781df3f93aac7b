"""The ideal conversation-sticky placement, as a small proxy: the routing benchmark's bound.

Each conversation goes to one instance for its whole life, chosen when it first appears
as the instance with the fewest requests in flight (ties: fewest conversations placed).
That is what a router with perfect knowledge of the workload would do: full affinity,
new conversations spread by load, no index and no guessing. The conversation is the
``x-session-id`` the load generator sends; a single question (``sp-g3-q17``,
``doc-d2-q5``, ``tn-t4-q9``) belongs to its group, document or tenant (``sp-g3``), since
the system prompt it shares with them is what it can reuse.

Bodies pass through untouched and answers stream back chunk by chunk with the
instance's ``x-backend-instance``. Run as ``python -m gateway.bench.sticky --port P
--backend URL ...`` (a process of its own, as every router under test is).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
from collections import Counter

import aiohttp
from aiohttp import web

PASSED = ("content-type", "x-backend-instance")
_QUESTION = re.compile(r"-q\d+$")


def affinity_key(session: str) -> str:
    """The unit of affinity: the conversation, or a shared-prefix question's group."""
    return _QUESTION.sub("", session)


class StickyProxy:
    """Places conversations on backends and relays calls; owns its client session."""

    def __init__(self, backends: list[str]) -> None:
        self._backends = backends
        self._placed: dict[str, str] = {}
        self._in_flight: Counter[str] = Counter()
        self._owned: Counter[str] = Counter()
        self._session: aiohttp.ClientSession | None = None

    def place(self, key: str) -> str:
        backend = self._placed.get(key)
        if backend is None:
            backend = min(self._backends, key=lambda b: (self._in_flight[b], self._owned[b]))
            self._placed[key] = backend
            self._owned[backend] += 1
        return backend

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        if request.method == "GET":
            backend = self._backends[0]
        else:
            backend = self.place(affinity_key(request.headers.get("x-session-id", "")))
        self._in_flight[backend] += 1
        try:
            return await self._relay(request, backend)
        finally:
            self._in_flight[backend] -= 1

    async def _relay(self, request: web.Request, backend: str) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        headers = {"content-type": request.headers.get("content-type", "application/json")}
        url = backend + request.rel_url.path_qs
        async with self._session.request(request.method, url, data=body, headers=headers) as up:
            passed = {h: v for h in PASSED if (v := up.headers.get(h)) is not None}
            resp = web.StreamResponse(status=up.status, headers=passed)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def serve(self, host: str, port: int, stop: asyncio.Event) -> None:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as self._session:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            try:
                await web.TCPSite(runner, host, port).start()
                await stop.wait()
            finally:
                await runner.cleanup()


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await StickyProxy(args.backend).serve(args.host, args.port, stop)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--backend", action="append", required=True, help="base URL, repeated")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()

"""Two simulators, each behind a counting proxy, and one gateway in front of the proxies.

The proxies count the POSTs that reach each backend: how many upstream calls the
gateway made is the figure every batching mechanism is judged by.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TypeVar

import aiohttp
import httpx
import openai
import pytest
from aiohttp import web

from tests.e2e.conftest import start_sims, write_config
from tests.servers import gateway_process

EMBEDDINGS_DELAY = 0.5
"""Seconds each upstream embeddings call takes (the simulator answers at once)."""
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}


class CountingProxy:
    """A pass-through proxy on loopback, in its own thread, counting POSTs by path.

    POSTs to a path in ``delays`` are held that many seconds first: a backend slower than
    the instant simulated one, so that calls a test sends together overlap upstream.
    """

    def __init__(self, target: str, delays: dict[str, float] | None = None) -> None:
        self.target = target
        self.delays = delays or {}
        self.posts: Counter[str] = Counter()
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> CountingProxy:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> str:
        self._session = aiohttp.ClientSession(auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self._runner.cleanup()
        await self._session.close()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if request.method == "POST":
            self.posts[request.path] += 1
            await asyncio.sleep(self.delays.get(request.path, 0))
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        body = await request.read()
        url = self.target + request.path_qs
        async with self._session.request(
            request.method, url, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(
                status=upstream.status,
                headers={k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


class Upstreams:
    """The simulators, the proxies in front of them, and what the proxies counted."""

    def __init__(self, sims: list[str], proxies: list[CountingProxy]) -> None:
        self.sims = sims
        self.proxies = proxies

    def posts(self, path: str) -> int:
        return sum(p.posts[path] for p in self.proxies)

    def wait_for_posts(self, path: str, more_than: int, timeout: float = 30) -> None:
        """Block until more than ``more_than`` POSTs to ``path`` have reached the proxies."""
        deadline = time.monotonic() + timeout
        while self.posts(path) <= more_than:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no POST to {path} reached the backends in {timeout} s"
            time.sleep(0.005)


@pytest.fixture(scope="package")
def upstreams() -> Iterator[Upstreams]:
    with ExitStack() as stack:
        sims = start_sims(stack, 2)
        delays = {"/v1/embeddings": EMBEDDINGS_DELAY}
        yield Upstreams(sims, [stack.enter_context(CountingProxy(u, delays)) for u in sims])


@pytest.fixture(scope="package")
def gateway(upstreams: Upstreams, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway with every batching mechanism on. The micro-batch window is far wider
    than an upstream embeddings call, so a batch goes when the call in flight returns,
    however slowly a loaded machine delivers the calls a test sends together."""
    path: Path = tmp_path_factory.mktemp("gw") / "gateway.yaml"
    cfg = write_config(
        path,
        [p.url for p in upstreams.proxies],
        batching={"embeddings_window": 5.0, "hold_max_wait": 5.0},
    )
    with gateway_process("serve", "--config", str(cfg)) as url:
        yield url


@pytest.fixture
async def client(gateway: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0) as c:
        yield c


def batched(gateway: str, mechanism: str) -> float:
    """gateway_batched_requests_total for the mechanism, summed over endpoints."""
    text = httpx.get(gateway + "/metrics").text
    prefix = "gateway_batched_requests_total{"
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and f'mechanism="{mechanism}"' in line
    )


T = TypeVar("T")


def all_of(kind: type[T], results: Sequence[object]) -> list[T]:
    """Gathered results (return_exceptions=True), each checked to be a ``kind``."""
    typed = [r for r in results if isinstance(r, kind)]
    assert len(typed) == len(results), results
    return typed

"""Two calls routed at once through an index lookup that yields to the event loop (as a
Redis round trip does) must see each other's load: the second goes elsewhere."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry

from gateway.answers import Answer, FixedAnswer
from gateway.backends import Backend, BackendPool
from gateway.flow import Call, PrefixKey, Request
from gateway.metrics import GatewayMetrics
from gateway.settings import RoutingSettings, load_settings
from gateway.stages.dispatch import dispatch
from gateway.stages.routing import CacheAware, rendezvous


class SlowIndex:
    """Knows nothing, and takes a trip through the event loop to say so."""

    healthy = True

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        await asyncio.sleep(0.01)
        return {}

    def record(self, model: str, backend: str, hashes: Sequence[int]) -> None:
        pass


class Upstream:
    async def send(self, call: Call, backend: Backend, payload: bytes) -> Answer:
        return FixedAnswer(b"{}", {})


def call(n: int) -> Call:
    c = Call(id=f"r{n}", path="/v1/chat/completions")
    c.request = Request(endpoint="chat", model="m", body={})
    c.prefix = PrefixKey(tokens=200, hashes=[n, n + 1], block_size=16, anchor=n)
    return c


async def test_calls_routed_together_see_each_others_load() -> None:
    settings = load_settings(
        models=[
            {
                "name": "m",
                "backends": [{"url": "http://127.0.0.1:1"}, {"url": "http://127.0.0.1:2"}],
            }
        ]
    )
    pool = BackendPool(settings.models, settings.upstream, GatewayMetrics(CollectorRegistry()))
    svc: Any = SimpleNamespace(
        backends=pool,
        index=SlowIndex(),
        policy=CacheAware(RoutingSettings()),
        upstream=Upstream(),
        settings=SimpleNamespace(metrics_enabled=False, upstream=settings.upstream),
    )
    model = pool.model("m")
    # Two conversations whose tie-break alone would put them on the same backend.
    idle = pool.candidates(model, set())
    first = rendezvous(idle, 1)
    other = next(n for n in range(2, 1000) if rendezvous(idle, n) == first)
    picked = await asyncio.gather(*(dispatch(call(n), model, b"{}", svc) for n in (1, other)))
    assert sorted(backend.name for backend, _ in picked) == ["127.0.0.1:1", "127.0.0.1:2"]

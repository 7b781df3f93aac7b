"""Services: every client and background task a running gateway owns, opened and closed
together by one AsyncExitStack in the app's lifespan."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from gateway.access import AccessLog
from gateway.backends import BackendPool
from gateway.batching import Batcher
from gateway.index import open_index
from gateway.index.base import PrefixIndex
from gateway.keys import KeyRing
from gateway.ledger import Ledger
from gateway.limits import Limiter, LimitMetrics, open_limiter
from gateway.metrics import GatewayMetrics, release_process
from gateway.settings import Settings
from gateway.stages import limits as limits_stage
from gateway.stages.forward import Upstream
from gateway.stages.prefix import PrefixHasher
from gateway.stages.routing import Policy, make_policy

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Services:
    settings: Settings
    registry: CollectorRegistry
    metrics: GatewayMetrics
    backends: BackendPool
    upstream: Upstream
    prefix: PrefixHasher
    index: PrefixIndex
    policy: Policy
    ledger: Ledger
    keys: KeyRing
    limits: Limiter
    plans: limits_stage.Plans
    batching: Batcher
    access: AccessLog
    started_at: float

    @classmethod
    @asynccontextmanager
    async def open(cls, settings: Settings) -> AsyncIterator[Services]:
        """Open every client and task in order; the stack closes them in reverse. One
        function on purpose: the order is the point, and it reads top to bottom."""
        async with AsyncExitStack() as stack:
            if settings.embedded:
                settings = await stack.enter_async_context(embedded_backend(settings))
            registry = CollectorRegistry(auto_describe=True)
            metrics = GatewayMetrics(registry, settings.metrics_multiproc_dir is not None)
            if settings.metrics_multiproc_dir is not None:
                stack.callback(release_process, settings.metrics_multiproc_dir)
            prefix = PrefixHasher(settings.prefix)
            for model in settings.models:
                prefix.encoding(model.encoding)  # a bad encoding fails the start, not a call
            ledger = Ledger(settings, registry)
            await ledger.start()
            stack.push_async_callback(ledger.aclose)
            keys = KeyRing(settings.auth, ledger.engine, registry, enabled=settings.auth_enabled)
            stack.push_async_callback(keys.aclose)
            keys.announce(settings.server.host)
            limits = open_limiter(settings, LimitMetrics(registry))
            await limits.start()
            stack.push_async_callback(limits.aclose)
            if keys.enabled:
                await limits.seed(limits_stage.seeds(await keys.month_spend(), datetime.now(UTC)))
            index = open_index(settings)
            await index.start()
            stack.push_async_callback(index.aclose)
            upstream = Upstream(settings.upstream, metrics if settings.metrics_enabled else None)
            await upstream.start()
            stack.push_async_callback(upstream.aclose)
            backends = BackendPool(settings.models, settings.upstream, metrics, index.bound)
            await backends.start()
            stack.push_async_callback(backends.aclose)
            batcher = Batcher(settings.batching)
            stack.push_async_callback(batcher.aclose)
            access = AccessLog.to_stdout(settings.server.access_log)
            stack.callback(access.flush)  # the last calls' lines, drained at shutdown
            yield cls(
                settings=settings,
                registry=registry,
                metrics=metrics,
                backends=backends,
                upstream=upstream,
                prefix=prefix,
                index=index,
                policy=make_policy(settings.routing),
                ledger=ledger,
                keys=keys,
                limits=limits,
                plans=limits_stage.Plans(),
                batching=batcher,
                access=access,
                started_at=time.time(),
            )


@asynccontextmanager
async def embedded_backend(settings: Settings) -> AsyncIterator[Settings]:
    """Start the built-in simulator on loopback and point one model at it."""
    from gateway.settings import BackendSettings, ModelSettings
    from gateway.sim.config import SimConfig
    from gateway.sim.server import start_simulator

    sim = settings.sim
    running = [
        await start_simulator(SimConfig(model=sim.model), port=sim.port + i if sim.port else 0)
        for i in range(sim.instances)
    ]
    try:
        backends = [BackendSettings(url=r.url, name=r.name) for r in running]
        log.warning(
            "embedded mode: no models configured; serving `%s` from %d built-in simulated "
            "backend(s) at %s (SQLite ledger at %s, in-process index)",
            sim.model, len(running), ", ".join(r.url for r in running), settings.database.url,
        )  # fmt: skip
        yield settings.model_copy(
            update={"models": [ModelSettings(name=sim.model, backends=backends, price=sim.price)]}
        )
    finally:
        for r in running:
            await r.aclose()

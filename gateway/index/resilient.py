"""The Redis index behind a circuit breaker, with the in-process index as its understudy.

Routing must never wait on or fail because of Redis. Every update also goes to the local
index, so when Redis errors or times out the gateway routes on what this replica has
seen; the breaker then stops asking Redis until a periodic probe finds it back. While
open, ``healthy`` is False and the policy hashes unknown prefixes consistently
(decision "fallback").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from gateway.index.base import PrefixIndex
from gateway.index.memory import MemoryIndex
from gateway.index.redis import REDIS_ERRORS, RedisIndex
from gateway.settings import RedisSettings

log = logging.getLogger(__name__)

TIMEOUTS_TO_OPEN = 3
"""Consecutive lookup timeouts that open the breaker. One slow answer (or one stall of a
busy event loop) should not switch routing to the local index; a refused or reset
connection opens it at once."""


class ResilientIndex:
    def __init__(self, shared: RedisIndex, local: MemoryIndex, settings: RedisSettings) -> None:
        self._shared = shared
        self._local: PrefixIndex = local
        self._timeout = settings.timeout
        self._probe_interval = settings.probe_interval
        self._open = False
        self._timeouts = 0
        self._prober: asyncio.Task[None] | None = None

    @property
    def healthy(self) -> bool:
        return not self._open and self._shared.healthy

    async def start(self) -> None:
        await self._shared.start()
        self._prober = asyncio.create_task(self._probe_forever(), name="prefix-index-probe")

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None
        await self._shared.aclose()

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        if self.healthy:
            try:
                async with asyncio.timeout(self._timeout):  # no extra task, unlike wait_for
                    found = await self._shared.lookup(model, hashes)
            except TimeoutError as exc:
                self._timeouts += 1
                if self._timeouts >= TIMEOUTS_TO_OPEN:
                    self._trip(exc)
            except REDIS_ERRORS as exc:
                self._trip(exc)
            else:
                self._timeouts = 0
                return found
        return await self._local.lookup(model, hashes)

    def record(self, model: str, backend: str, hashes: Sequence[int]) -> None:
        self._local.record(model, backend, hashes)
        if not self._open:
            self._shared.record(model, backend, hashes)

    def bound(self, backend: str, tokens: int) -> None:
        self._local.bound(backend, tokens)
        self._shared.bound(backend, tokens)

    def forget(self, model: str, backend: str, hashes: Sequence[int], keep_blocks: int) -> None:
        self._local.forget(model, backend, hashes, keep_blocks)
        if not self._open:
            self._shared.forget(model, backend, hashes, keep_blocks)

    async def flush(self) -> None:
        await self._shared.flush()

    async def size(self) -> int:
        if self.healthy:
            try:
                return await asyncio.wait_for(self._shared.size(), max(self._timeout, 1.0))
            except REDIS_ERRORS as exc:
                self._trip(exc)
        return await self._local.size()

    def _trip(self, exc: BaseException) -> None:
        if not self._open:
            log.warning("prefix index: Redis failing (%r); routing on the local index", exc)
        self._open = True
        self._timeouts = 0

    async def _probe_forever(self) -> None:
        """Close the breaker when Redis answers again; also open it when the flusher failed."""
        while True:
            await asyncio.sleep(self._probe_interval)
            if not self._open and self._shared.healthy:
                continue
            try:
                ok = await asyncio.wait_for(self._shared.ping(), max(self._timeout, 1.0))
            except TimeoutError:
                ok = False
            if ok and self._open:
                log.warning("prefix index: Redis is back")
            self._open = not ok

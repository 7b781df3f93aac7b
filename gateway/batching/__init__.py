"""The batch stage: calls that can share upstream work do, each mechanism behind its setting.

- coalescing (``coalesce``): identical deterministic calls in flight together share one
  upstream call (:mod:`gateway.batching.coalesce`);
- cold-prefix hold (``cold_prefix_hold``): calls sharing a long prefix no backend holds
  wait for one leader to prefill it, then follow it (:mod:`gateway.batching.hold`);
- micro-batching (``embeddings_window``): concurrent embeddings calls go upstream as one
  list request (:mod:`gateway.batching.embeddings`).

Each call that rode on shared work says so in ``Call.served_by`` ("coalesced", "held",
"batched"), which the metrics count and the ledger records.
"""

from __future__ import annotations

from gateway.answers import Answer
from gateway.backends import Backend, Model
from gateway.batching.coalesce import Coalescer, coalesce_key
from gateway.batching.embeddings import EmbeddingBatcher
from gateway.batching.hold import PrefixHold, Send
from gateway.flow import Call
from gateway.settings import BatchingSettings

__all__ = ["Answer", "Batcher", "Send", "owns_upstream"]


class Batcher:
    """The stage's entry point and the owner of its state and tasks."""

    def __init__(self, settings: BatchingSettings) -> None:
        self._settings = settings
        self._coalescer = Coalescer()
        self._hold = PrefixHold(settings)
        self._embeddings = EmbeddingBatcher(settings)

    async def submit(
        self, call: Call, model: Model, payload: bytes, send: Send
    ) -> tuple[Backend, Answer]:
        """Send the call upstream, alone or sharing; the answer reads like an upstream one."""
        assert call.request is not None
        s = self._settings
        if call.request.endpoint == "embeddings":
            if s.embeddings_window > 0 and s.embeddings_max_batch > 1:
                return await self._embeddings.submit(call, model.upstream_name, payload, send)
            return await send(call, payload, None)

        async def forward(c: Call, body: bytes) -> tuple[Backend, Answer]:
            if s.cold_prefix_hold:
                return await self._hold.submit(c, body, send)
            return await send(c, body, None)

        key = coalesce_key(call.request) if s.coalesce else None
        if key is not None:
            return await self._coalescer.submit(call, key, payload, forward)
        return await forward(call, payload)

    async def aclose(self) -> None:
        await self._embeddings.aclose()
        await self._coalescer.aclose()


def owns_upstream(call: Call) -> bool:
    """False for a call that rode on another call's upstream request: that one carries
    the backend's load and teaches the index."""
    return call.served_by not in ("coalesced", "batched")

"""A backend's share of this gateway's work, counted for the routing cost model.

The engine's own gauges arrive once a second; calls arrive many times as often, and a
burst that lands between two scrapes would all see the same idle backend. So the gateway
counts what it has sent itself, exactly and at once: the prompt tokens each backend still
has to prefill for our calls (sent, no first byte yet) and the KV cache our running calls
hold; the scrape adds other replicas'.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.flow import Call
from gateway.stages.costs import MEMORY, Load, Rates

UNKNOWN_CAPACITY_TOKENS = 1 << 22
"""Assumed when a backend does not say (no ``vllm:cache_config_info``) and no setting
does: more than one vLLM instance's KV cache holds (about 4M tokens)."""


@dataclass(slots=True, eq=False)
class Backlog:
    rates: Rates = field(default_factory=Rates)
    capacity_tokens: int = 0
    """KV capacity: ``num_gpu_blocks x block_size`` from the engine, else the setting."""
    written_tokens: float = 0.0
    """Prompt tokens our calls have had the backend prefill into its cache."""
    busy: float = 0.0
    """Share of routing decisions that found prefill work of ours queued here: arrivals
    see time averages, so this is the share of time the backend is prefilling for us."""
    pending_at_scrape: int = 0
    """Our calls still awaiting their first byte when the last scrape answered."""
    kv_tokens: float = 0.0
    """KV cache our calls there hold or will: their prompts and the answers they may write."""
    _held: dict[str, float] = field(default_factory=dict)
    """Each of our calls in flight there (by id) and its share of ``kv_tokens``."""
    _prefilling: dict[str, Call] = field(default_factory=dict)
    """Our calls there that may still be prefilling (pruned as they are seen done)."""

    def scraped(self, capacity_tokens: int | None) -> None:
        """The engine answered a scrape: note its capacity and how many of our calls it
        had not answered yet (its waiting queue counts those)."""
        if capacity_tokens:
            self.capacity_tokens = capacity_tokens
        self.pending_at_scrape = len(self.pending(time.perf_counter()))

    def admit(self, call: Call) -> None:
        tokens = self._kv_of(call)
        self._held[call.id] = tokens
        self.kv_tokens += tokens
        self._prefilling[call.id] = call
        if call.route is not None:
            self.written_tokens += call.route.uncached_tokens

    def release(self, call: Call) -> None:
        self.kv_tokens -= self._held.pop(call.id, 0.0)
        self._prefilling.pop(call.id, None)

    def pending(self, now: float) -> list[Call]:
        """Our calls whose prompt is not prefilled yet."""
        done = [i for i, c in self._prefilling.items() if not prefilling(c, now)]
        for i in done:
            del self._prefilling[i]
        return list(self._prefilling.values())

    def load(self, waiting: int, running: int, kv_usage: float) -> Load:
        """What a call routed now finds here; ``waiting``, ``running`` and ``kv_usage`` are
        the engine's from the last scrape (``running`` counts ours)."""
        pending = self.pending(time.perf_counter())
        ours = sum(c.route.uncached_tokens for c in pending if c.route is not None)
        theirs = max(waiting - self.pending_at_scrape, 0) * self.rates.uncached_per_call
        keep = 1.0 - 1.0 / MEMORY
        self.busy = keep * self.busy + (1 - keep) * (ours > 0)
        capacity = self.capacity_tokens or UNKNOWN_CAPACITY_TOKENS
        free = max(min(capacity - self.kv_tokens, capacity * (1 - kv_usage)), 0.0)
        return Load(
            queued_tokens=ours + theirs,
            running=max(running, len(self._held)),
            utilization=max(self.busy, 1 - free / capacity),
            free_tokens=free,
            full=min(self.written_tokens / capacity, 1.0),
        )

    def _kv_of(self, call: Call) -> float:
        """The call's own KV blocks: what it prefills and answers (the prefix it found
        cached is shared with whoever else uses it)."""
        prefill = call.route.uncached_tokens if call.route is not None else 0
        asked = call.request.max_tokens if call.request is not None else None
        return prefill + (asked if asked is not None else self.rates.completion_per_call)


def prefilling(call: Call, now: float) -> bool:
    """No first byte yet, and for an answer that comes whole (no first byte to see), not
    yet past the TTFT routing expected."""
    if call.first_byte_at is not None or call.route is None or call.dispatched_at is None:
        return False
    streamed = call.request is not None and call.request.stream
    return streamed or now - call.dispatched_at < call.route.expected_ttft

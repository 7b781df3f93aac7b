"""The simulated engine: a continuous-batching scheduler over a prefix cache.

Each step costs a fixed time plus a cost per uncached prompt token it prefills (at most
`max_num_batched_tokens` per step, as vLLM's chunked prefill) plus a cost per decoding
sequence, and gives every running sequence that finished its prefill one more token.
A request whose prefix is cached skips that part of the prefill, so cache hits show up
in time to first token exactly as on a real server.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections import deque
from dataclasses import dataclass, field

from gateway.sim import tokenizer
from gateway.sim.cache import PrefixCache, block_hashes
from gateway.sim.config import SimConfig

# vLLM's bucket boundaries for vllm:time_to_first_token_seconds.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip


@dataclass(slots=True)
class Histogram:
    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value


@dataclass(slots=True)
class EngineStats:
    """Monotonic counters behind the vllm:* metrics (plain ints: the hot path stays cheap)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    aborted: int = 0
    busy_seconds: float = 0.0
    """Engine time spent on steps, by the cost model: the instance's work, whatever the
    calls' sizes (calls alone say little about load when they differ tenfold)."""
    finished: dict[str, int] = field(default_factory=lambda: {"stop": 0, "length": 0})
    ttft: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS))


@dataclass(eq=False, slots=True)
class Sequence:
    """One request inside the engine."""

    prompt: list[int]
    max_tokens: int
    stop_naturally: bool
    """No max_tokens was given: the answer ends with "stop" rather than "length"."""
    hashes: list[int]
    """Hashes of the prompt's full blocks."""
    seed: int
    """Picks the generated words: the same prompt always gets the same answer."""
    arrival: float
    output: list[int] = field(default_factory=list)
    """Generated tokens, as indexes into tokenizer.GENERATED_TOKENS."""
    cached_tokens: int = 0
    created_cache_tokens: int = 0
    """Prompt tokens this request added to the cache, in new whole blocks."""
    computed: int = 0
    """Prompt tokens whose KV exists (cached or prefilled)."""
    held: list[int] = field(default_factory=list)
    """Block hashes this sequence pins, in order."""
    private: int = 0
    finish_reason: str | None = None
    first_token_at: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    taken: int = 0
    """Tokens already handed to the HTTP side."""

    async def tokens(self) -> list[int]:
        """Wait for tokens not yet taken; empty once the sequence has finished."""
        while len(self.output) == self.taken and self.finish_reason is None:
            self.changed.clear()
            await self.changed.wait()
        new = self.output[self.taken :]
        self.taken = len(self.output)
        return new


class Engine:
    """One instance's engine; owns the scheduler task (start/aclose)."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        self.cache = PrefixCache(config.cache_blocks)
        self.stats = EngineStats()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    def start(self) -> None:
        if not self.config.instant:
            self._task = self._loop.create_task(self._run(), name="sim-scheduler")

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def submit(self, prompt: list[int], max_tokens: int | None) -> Sequence:
        """Queue a request; in instant mode it is complete on return."""
        seq = Sequence(
            prompt=prompt,
            max_tokens=max_tokens or self.config.default_max_tokens,
            stop_naturally=max_tokens is None,
            hashes=block_hashes(prompt, self.config.block_size),
            seed=hash(tuple(prompt)),
            arrival=self._loop.time(),
        )
        self.stats.prompt_tokens += len(prompt)
        if self.config.instant:
            self._complete_now(seq)
        else:
            self.waiting.append(seq)
            self._wake.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """The client went away: drop the sequence and unpin its blocks."""
        if seq.finish_reason is not None:
            return
        seq.finish_reason = "abort"
        self.stats.aborted += 1
        if seq in self.running:
            self.running.remove(seq)
            self.cache.release(seq.held, seq.private)
        else:
            with contextlib.suppress(ValueError):
                self.waiting.remove(seq)

    # -- scheduling -------------------------------------------------------------------

    async def _run(self) -> None:
        cfg = self.config
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
            self._admit()
            decoding, prefills = self._plan()
            prefill_tokens = sum(n for _, n in prefills)
            cost_ms = cfg.step_ms + cfg.prefill_token_ms * prefill_tokens
            cost_ms += cfg.decode_seq_ms * len(decoding)
            seconds = cost_ms / cfg.speed / 1000
            self.stats.busy_seconds += seconds
            await asyncio.sleep(seconds)
            self._apply(decoding, prefills)

    def _admit(self) -> None:
        """Move waiting requests to running while sequence slots and KV blocks allow."""
        bs = self.config.block_size
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            hits = self._hit_blocks(seq)
            need = -(-(len(seq.prompt) + seq.max_tokens) // bs) - hits
            need = min(need, self.cache.capacity - hits)
            self.cache.acquire(seq.hashes[:hits])
            if not self.cache.reserve(need):
                self.cache.release(seq.hashes[:hits], 0)
                return
            self.waiting.popleft()
            self._start(seq, hits)
            seq.private = need
            self.running.append(seq)

    def _hit_blocks(self, seq: Sequence) -> int:
        """How many leading blocks of the prompt are cached.

        As in vLLM, the last prompt token is always computed, so a fully cached prompt
        that ends on a block boundary still recomputes its last block.
        """
        usable = (len(seq.prompt) - 1) // self.config.block_size
        return self.cache.match(seq.hashes[:usable])

    def _start(self, seq: Sequence, hits: int) -> None:
        """The sequence holds its (already acquired) cached blocks; count the lookup."""
        seq.held = seq.hashes[:hits]
        seq.cached_tokens = seq.computed = hits * self.config.block_size
        self.stats.prefix_queries += len(seq.prompt)
        self.stats.prefix_hits += seq.cached_tokens

    def _plan(self) -> tuple[list[Sequence], list[tuple[Sequence, int]]]:
        budget = self.config.max_num_batched_tokens
        decoding = [s for s in self.running if s.computed == len(s.prompt)]
        budget -= len(decoding)
        prefills: list[tuple[Sequence, int]] = []
        for seq in self.running:
            left = len(seq.prompt) - seq.computed
            if left and budget > 0:
                chunk = min(left, budget)
                budget -= chunk
                prefills.append((seq, chunk))
        return decoding, prefills

    def _apply(self, decoding: list[Sequence], prefills: list[tuple[Sequence, int]]) -> None:
        now = self._loop.time()
        for seq in decoding:
            if seq.finish_reason is None:
                self._emit(seq, now)
        for seq, chunk in prefills:
            if seq.finish_reason is not None:
                continue
            seq.computed += chunk
            self._commit_prompt_blocks(seq)
            if seq.computed == len(seq.prompt):
                self._emit(seq, now)

    def _commit_prompt_blocks(self, seq: Sequence) -> None:
        bs = self.config.block_size
        while len(seq.held) < len(seq.hashes) and (len(seq.held) + 1) * bs <= seq.computed:
            self._commit(seq, seq.hashes[len(seq.held)])

    def _commit(self, seq: Sequence, h: int) -> None:
        """Cache a block this sequence filled; a new prompt block counts as created."""
        from_private = seq.private > 0
        seq.private -= from_private
        new = self.cache.commit(h, from_private)
        if new and len(seq.held) < len(seq.hashes):
            seq.created_cache_tokens += self.config.block_size
        seq.held.append(h)

    def _emit(self, seq: Sequence, now: float) -> None:
        seq.output.append(tokenizer.generated_at(seq.seed, len(seq.output)))
        self.stats.generation_tokens += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
            self.stats.ttft.observe(now - seq.arrival)
        if len(seq.output) >= seq.max_tokens:
            self._finish(seq)
        seq.changed.set()

    def _finish(self, seq: Sequence) -> None:
        """Cache the answer's full blocks too (the next turn can hit them), then unpin."""
        ids = tokenizer.GENERATED_IDS
        # The last sampled token is never fed back, so its KV never exists.
        kv = seq.prompt + [ids[i] for i in seq.output[:-1]]
        parent = seq.hashes[-1] if seq.hashes else 0
        for h in block_hashes(kv, self.config.block_size, len(seq.hashes), parent):
            self._commit(seq, h)
        seq.finish_reason = "stop" if seq.stop_naturally else "length"
        self.stats.finished[seq.finish_reason] += 1
        if seq in self.running:
            self.running.remove(seq)
        self.cache.release(seq.held, seq.private)
        seq.private = 0

    def _complete_now(self, seq: Sequence) -> None:
        """Instant mode: the whole request in one go, with the same cache bookkeeping."""
        hits = self._hit_blocks(seq)
        self.cache.acquire(seq.hashes[:hits])
        self._start(seq, hits)
        for h in seq.hashes[hits:]:
            self._commit(seq, h)
        seq.computed = len(seq.prompt)
        seq.output = tokenizer.generated(seq.seed, seq.max_tokens)
        self.stats.generation_tokens += seq.max_tokens
        seq.first_token_at = seq.arrival
        self.stats.ttft.observe(0.0)
        self._finish(seq)

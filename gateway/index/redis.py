"""The shared index in Redis: every gateway replica routes with the same handles.

Keys (all start with ``redis.key_prefix``; ``{M}``, the model name, is a Redis Cluster
hash tag, so every key one script touches lives in the model's slot):

- ``px:{M}:held:<backend>``: a sorted set, one member per block hash the backend holds,
  scored by its last use (µs, Redis server clock). It answers "does b hold h, and since
  when" (ZSCORE) and, in score order, which handles expired and which a backend of known
  capacity has evicted. About 110 bytes a handle; the key expires ``handle_ttl`` after
  its last update.
- ``px:{M}:backends``: the model's backends with handles.
- ``px:models``: the models with handles, for ``size()``.

A lookup is one EVALSHA: the script runs ``memory.deepest``, the multi-backend binary
search, over the prompt's block hashes (sent as ARGV) and answers [backend, blocks, ...].
The scripts build the per-backend key names from the model's key base rather than
receiving each in KEYS; the hash tag keeps them in the slot of KEYS[1], as Redis Cluster
requires. Updates are queued and sent by one flusher task, many to a pipeline, off the
request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from array import array
from collections.abc import Sequence

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.client import Pipeline
from redis.exceptions import RedisError

from gateway.index.base import Capacities
from gateway.settings import PrefixSettings, RedisSettings, RoutingSettings

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)
BATCH = 256
"""Queued updates sent in one pipeline."""

Update = tuple[str, str, str, "array[int]"]
"""("record" | "forget", model, backend, block hashes). The hashes wait as 8-byte machine
words and become hex strings only when sent: a queue of ``queue_size`` updates of up to
``max_blocks`` hashes each would otherwise hold about 70 bytes a hash (a str object each),
so a flusher falling behind on long prompts could hold a gigabyte."""

NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

# KEYS: backends. ARGV: base, ttl µs, hashes...
LOOKUP = (
    NOW
    + """
local base, oldest = ARGV[1], now - tonumber(ARGV[2])
local n = #ARGV - 2
local out = {}
if n == 0 then return out end
local function holding(group, i)
  local yes, no = {}, {}
  for b in pairs(group) do
    local score = redis.call('ZSCORE', base .. 'held:' .. b, ARGV[2 + i])
    if score and tonumber(score) >= oldest then yes[b] = true else no[b] = true end
  end
  return yes, no
end
local all = {}
for _, b in ipairs(redis.call('SMEMBERS', KEYS[1])) do all[b] = true end
local stack = {{1, n, (holding(all, 1))}}
while #stack > 0 do
  local top = table.remove(stack)
  local lo, hi, group = top[1], top[2], top[3]
  if next(group) ~= nil then
    if lo == hi then
      for b in pairs(group) do out[#out + 1] = b; out[#out + 1] = lo end
    else
      local mid = math.floor((lo + hi + 1) / 2)
      local yes, no = holding(group, mid)
      stack[#stack + 1] = {mid, hi, yes}
      stack[#stack + 1] = {lo, mid - 1, no}
    end
  end
end
return out
"""
)

# KEYS: held, backends. ARGV: backend, ttl µs, capacity blocks, hashes...
# Deeper blocks score 1 µs older per block, so a parent always outranks its children and
# trimming keeps every backend's holdings a prefix.
RECORD = (
    NOW
    + """
local held, backend = KEYS[1], ARGV[1]
local ttl, cap = tonumber(ARGV[2]), tonumber(ARGV[3])
local ttl_ms = math.ceil(ttl / 1000)
for i = 4, #ARGV do
  redis.call('ZADD', held, string.format('%.0f', now - (i - 4)), ARGV[i])
end
redis.call('ZREMRANGEBYSCORE', held, '-inf', string.format('(%.0f', now - ttl))
local excess = redis.call('ZCARD', held) - cap
if excess > 0 then redis.call('ZREMRANGEBYRANK', held, 0, excess - 1) end
redis.call('PEXPIRE', held, ttl_ms)
redis.call('SADD', KEYS[2], backend)
redis.call('PEXPIRE', KEYS[2], ttl_ms)
"""
)

# KEYS: backends. ARGV: base, ttl µs.
SIZE = (
    NOW
    + """
local total = 0
for _, b in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  total = total + redis.call('ZCOUNT', ARGV[1] .. 'held:' .. b,
                             string.format('%.0f', now - tonumber(ARGV[2])), '+inf')
end
return total
"""
)


class RedisIndex:
    """Handles in Redis; ``healthy`` reflects the last command's outcome."""

    def __init__(
        self,
        client: Redis | RedisCluster,
        redis: RedisSettings,
        routing: RoutingSettings,
        prefix: PrefixSettings,
    ) -> None:
        self._client = client
        self._root = f"{redis.key_prefix}px:"
        self._ttl = int(routing.handle_ttl * 1_000_000)
        self._capacity = Capacities(prefix.block_size)
        self._queue: asyncio.Queue[Update] = asyncio.Queue(redis.queue_size)
        self._lookup = client.register_script(LOOKUP)
        self._record = client.register_script(RECORD)
        self._size = client.register_script(SIZE)
        self._flusher: asyncio.Task[None] | None = None
        self.healthy = True
        self.dropped = 0
        """Updates lost to a full queue or a failed flush."""

    async def start(self) -> None:
        self._flusher = asyncio.create_task(self._flush_forever(), name="prefix-index-flusher")

    async def aclose(self) -> None:
        if self._flusher is not None:
            with contextlib.suppress(*REDIS_ERRORS):
                await asyncio.wait_for(self.flush(), 1.0)
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        await self._client.aclose()

    async def ping(self) -> bool:
        try:
            ok = bool(await self._client.ping())
        except REDIS_ERRORS:
            ok = False
        self.healthy = ok
        return ok

    async def lookup(self, model: str, hashes: Sequence[int]) -> dict[str, int]:
        try:
            flat = await self._lookup(
                keys=[self._base(model) + "backends"],
                args=[self._base(model), self._ttl, *map(hexa, hashes)],
            )
        except REDIS_ERRORS:
            self.healthy = False
            raise
        self.healthy = True
        return {flat[i].decode(): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    def record(self, model: str, backend: str, hashes: Sequence[int]) -> None:
        if hashes:
            self._put(("record", model, backend, array("Q", hashes)))

    def bound(self, backend: str, tokens: int) -> None:
        self._capacity.bound(backend, tokens)

    def forget(self, model: str, backend: str, hashes: Sequence[int], keep_blocks: int) -> None:
        drop = hashes[max(keep_blocks, 0) :]
        if drop:
            self._put(("forget", model, backend, array("Q", drop)))

    async def flush(self) -> None:
        await self._queue.join()

    async def size(self) -> int:
        models = await self._client.smembers(self._root + "models")
        total = 0
        for model in models:
            # bytes from a client built without decode_responses, as the gateway's are
            base = self._base(model.decode() if isinstance(model, bytes) else model)
            total += int(await self._size(keys=[base + "backends"], args=[base, self._ttl]))
        return total

    def _base(self, model: str) -> str:
        return f"{self._root}{{{model}}}:"

    def _put(self, op: Update) -> None:
        """Queue an update; a full queue sheds its oldest update rather than block a call."""
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
            self.dropped += 1
        self._queue.put_nowait(op)

    async def _flush_forever(self) -> None:
        while True:
            await self._flush_batch(await self._queue.get())

    async def _flush_batch(self, first: Update) -> None:
        """Send ``first`` and what is queued behind it, up to BATCH. A function of its own
        so the batch goes when it is sent, not when the next update arrives."""
        ops = [first]
        while len(ops) < BATCH and not self._queue.empty():
            ops.append(self._queue.get_nowait())
        try:
            await self._send(ops)
            self.healthy = True
        # Whatever goes wrong, the flusher lives on: a dead flusher would silently
        # stop every later update.
        except Exception as exc:  # noqa: BLE001
            self.healthy = False
            self.dropped += len(ops)
            log.warning("prefix index: %d updates lost: %r", len(ops), exc)
        finally:
            for _ in ops:
                self._queue.task_done()

    async def _send(self, ops: list[Update]) -> None:
        """One pipeline to a single server. A cluster client cannot pipeline scripts, so
        there each update is a call of its own."""
        models = sorted({op[1] for op in ops if op[0] == "record"})
        if isinstance(self._client, RedisCluster):
            for op in ops:
                await self._apply(op, self._client)
            if models:
                await self._client.sadd(self._root + "models", *models)
            return
        async with self._client.pipeline(transaction=False) as pipe:
            for op in ops:
                await self._apply(op, pipe)
            if models:
                pipe.sadd(self._root + "models", *models)
            await pipe.execute()

    async def _apply(self, op: Update, client: RedisCluster | Pipeline) -> None:
        """Run (or, on a pipeline, queue) one update; a lost script is reloaded."""
        kind, model, backend, hashes = op
        base = self._base(model)
        held = f"{base}held:{backend}"
        members = map(hexa, hashes)
        if kind == "record":
            args: list[str | int] = [backend, self._ttl, self._capacity[backend], *members]
            await self._record(keys=[held, base + "backends"], args=args, client=client)
        else:
            await client.zrem(held, *members)


def hexa(h: int) -> str:
    return format(h, "016x")

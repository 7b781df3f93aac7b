"""The shared index in Redis: every gateway replica routes with the same handles.

Keys (all start with ``redis.key_prefix``; ``{model}`` is a Redis Cluster hash tag, so
every key one script touches lives in the model's slot):

- ``px:{M}:h:<hash>``: a hash, backend -> last use (µs, Redis server clock); the key
  expires ``handle_ttl`` after its last renewal.
- ``px:{M}:lru:<backend>``: a sorted set of the backend's block hashes by last use; it
  finds expired handles and, with a known capacity, the least recently used to evict.
- ``px:{M}:backends``: the backends with handles, for ``size()``.
- ``px:models``: the models with handles, for ``size()``.

A lookup is one EVALSHA: the script runs the multi-backend binary search of
``memory.deepest`` over the prompt's block hashes and answers [backend, blocks, ...].
The scripts build handle keys from the model's key base rather than receiving each in
KEYS (a 2,048-block prompt would send 2,048 key names); the hash tag keeps them in the
slot of KEYS[1], as Redis Cluster requires. Updates are queued and sent by one flusher
task, many to a pipeline, off the request path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

from redis.asyncio import Redis, RedisCluster
from redis.exceptions import NoScriptError, RedisError

from gateway.settings import PrefixSettings, RedisSettings, RoutingSettings

log = logging.getLogger(__name__)

REDIS_ERRORS = (RedisError, OSError, TimeoutError)
BATCH = 256
"""Queued updates sent in one pipeline."""

NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
"""

LOOKUP = (
    NOW
    + """
local base, oldest = ARGV[1], now - tonumber(ARGV[2])
local n = #ARGV - 2
local out = {}
if n == 0 then return out end
local function holders(i)
  local flat = redis.call('HGETALL', base .. 'h:' .. ARGV[2 + i])
  local set = {}
  for j = 1, #flat, 2 do
    if tonumber(flat[j + 1]) >= oldest then set[flat[j]] = true end
  end
  return set
end
local stack = {{1, n, holders(1)}}
while #stack > 0 do
  local top = table.remove(stack)
  local lo, hi, group = top[1], top[2], top[3]
  if next(group) ~= nil then
    if lo == hi then
      for b in pairs(group) do out[#out + 1] = b; out[#out + 1] = lo end
    else
      local mid = math.floor((lo + hi + 1) / 2)
      local there = holders(mid)
      local yes, no = {}, {}
      for b in pairs(group) do
        if there[b] then yes[b] = true else no[b] = true end
      end
      stack[#stack + 1] = {mid, hi, yes}
      stack[#stack + 1] = {lo, mid - 1, no}
    end
  end
end
return out
"""
)

DROP = """
local function drop(base, lru, backend, hashes)
  for _, h in ipairs(hashes) do
    redis.call('HDEL', base .. 'h:' .. h, backend)
    redis.call('ZREM', lru, h)
  end
end
"""

# KEYS: lru, backends. ARGV: base, backend, ttl µs, capacity blocks, hashes...
# Deeper blocks get a score 1 µs older per block, so a parent always outranks its
# children and trimming keeps every backend's holdings a prefix.
RECORD = (
    NOW
    + DROP
    + """
local lru, base, backend = KEYS[1], ARGV[1], ARGV[2]
local ttl, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local ttl_ms = math.ceil(ttl / 1000)
for i = 5, #ARGV do
  local score = string.format('%.0f', now - (i - 5))
  local key = base .. 'h:' .. ARGV[i]
  redis.call('HSET', key, backend, score)
  redis.call('PEXPIRE', key, ttl_ms)
  redis.call('ZADD', lru, score, ARGV[i])
end
drop(base, lru, backend,
     redis.call('ZRANGEBYSCORE', lru, '-inf', string.format('(%.0f', now - ttl), 'LIMIT', 0, 1024))
if cap > 0 then
  local excess = redis.call('ZCARD', lru) - cap
  if excess > 0 then drop(base, lru, backend, redis.call('ZRANGE', lru, 0, excess - 1)) end
end
redis.call('PEXPIRE', lru, ttl_ms)
redis.call('SADD', KEYS[2], backend)
redis.call('PEXPIRE', KEYS[2], ttl_ms)
"""
)

# KEYS: lru. ARGV: base, backend, hashes...
FORGET = (
    DROP
    + """
local hashes = {}
for i = 3, #ARGV do hashes[#hashes + 1] = ARGV[i] end
drop(ARGV[1], KEYS[1], ARGV[2], hashes)
"""
)

# KEYS: backends. ARGV: base, ttl µs.
SIZE = (
    NOW
    + """
local total = 0
for _, b in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  total = total + redis.call('ZCOUNT', ARGV[1] .. 'lru:' .. b, now - tonumber(ARGV[2]), '+inf')
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
        self._capacity = routing.backend_cache_tokens // prefix.block_size
        self._queue: asyncio.Queue[tuple[str, str, str, list[str]]] = asyncio.Queue(
            redis.queue_size
        )
        self._lookup = client.register_script(LOOKUP)
        self._record = client.register_script(RECORD)
        self._forget = client.register_script(FORGET)
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
            self._put(("record", model, backend, [hexa(h) for h in hashes]))

    def forget(self, model: str, backend: str, hashes: Sequence[int], keep_blocks: int) -> None:
        drop = hashes[max(keep_blocks, 0) :]
        if drop:
            self._put(("forget", model, backend, [hexa(h) for h in drop]))

    async def flush(self) -> None:
        await self._queue.join()

    async def size(self) -> int:
        models = await self._client.smembers(self._root + "models")
        total = 0
        for model in models:
            base = self._base(model.decode())
            total += int(await self._size(keys=[base + "backends"], args=[base, self._ttl]))
        return total

    def _base(self, model: str) -> str:
        return f"{self._root}{{{model}}}:"

    def _put(self, op: tuple[str, str, str, list[str]]) -> None:
        """Queue an update; a full queue sheds its oldest update rather than block a call."""
        if self._queue.full():
            self._queue.get_nowait()
            self._queue.task_done()
            self.dropped += 1
        self._queue.put_nowait(op)

    async def _flush_forever(self) -> None:
        while True:
            ops = [await self._queue.get()]
            while len(ops) < BATCH and not self._queue.empty():
                ops.append(self._queue.get_nowait())
            try:
                await self._send_loaded(ops)
                self.healthy = True
            except REDIS_ERRORS as exc:
                self.healthy = False
                self.dropped += len(ops)
                log.warning("prefix index: %d updates lost: %s", len(ops), exc)
            finally:
                for _ in ops:
                    self._queue.task_done()

    async def _send_loaded(self, ops: list[tuple[str, str, str, list[str]]]) -> None:
        """Send, loading the scripts first if the server lost them (a restart, a new
        cluster node); the plain client's pipeline does this itself, the cluster's not."""
        try:
            await self._send(ops)
        except NoScriptError:
            for script in (self._record, self._forget):
                await self._client.script_load(script.script)
            await self._send(ops)

    async def _send(self, ops: list[tuple[str, str, str, list[str]]]) -> None:
        async with self._client.pipeline(transaction=False) as pipe:
            models = set()
            for kind, model, backend, hashes in ops:
                base = self._base(model)
                lru = f"{base}lru:{backend}"
                args: list[Any]
                if kind == "record":
                    models.add(model)
                    args = [base, backend, self._ttl, self._capacity, *hashes]
                    await self._record(keys=[lru, base + "backends"], args=args, client=pipe)
                else:
                    await self._forget(keys=[lru], args=[base, backend, *hashes], client=pipe)
            if models:
                pipe.sadd(self._root + "models", *models)
            await pipe.execute()


def hexa(h: int) -> str:
    return format(h, "016x")

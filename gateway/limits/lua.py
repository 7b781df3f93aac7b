"""The Redis limiter's scripts: GRANT (before calls), SETTLE (after them), HEARTBEAT.

Times are µs on the Redis clock; a bucket is its theoretical arrival time (GCRA, as
base.py), stored until the bucket is full again. Arguments go as one string and the
reply comes back as one (a fraction of redis-py's work for a dozen numbers).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.limits.lease import SHARE, Ask

OK, BUCKET, BUDGET = 0, 1, 2
"""GRANT's answer: the call passes, or which kind of thing refused it."""

NOW = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local W = 60000000
local function store(key, tat)
  if tat > now then
    redis.call('SET', key, string.format('%.0f', tat), 'PX', math.ceil((tat - now) / 1000) + 1)
  else
    redis.call('DEL', key)
  end
end
local function tat_of(key)
  local tat = tonumber(redis.call('GET', key) or '0')
  if tat < now then return now end
  return tat
end
"""

# KEYS: n buckets, then budgets' counters. ARGV[1]: "n", then per bucket "limit,need,extra,
# give", then per budget its limit. need: the call's own cost (all or nothing across the
# buckets, as base.py); extra: units the replica would like to hold beyond it (granted as
# far as the bucket has room to spare, never failing the call); give: held units coming
# back (applied even when the call is refused).
# Reply: "code,which,wait" (code 0 ok, 1 bucket, 2 budget; which 1-based; wait µs, -1:
# never fits), then ",granted,remaining,reset µs" per bucket, then ",spend" per budget.
GRANT = (
    NOW
    + f"""
local SHARE = {SHARE}
"""
    + """
local a = {}
for v in string.gmatch(ARGV[1], '[^,]+') do a[#a + 1] = tonumber(v) end
local n = a[1]
local code, which, wait = 0, 0, 0
local spend = {}
for j = 1, #KEYS - n do
  spend[j] = tonumber(redis.call('GET', KEYS[n + j]) or '0')
  if code == 0 and spend[j] >= a[1 + 4 * n + j] then code, which = 2, j end
end
local tats = {}
for i = 1, n do
  local o = 4 * i - 2
  local step = W / a[o]
  local tat = tat_of(KEYS[i])
  if a[o + 3] > 0 then tat = math.max(tat - a[o + 3] * step, now) end
  tats[i] = tat
  local excess = tat + a[o + 1] * step - now - W
  if code == 0 and a[o + 1] > 0 and excess > 0.001 then
    code, which = 1, i
    if a[o + 1] > a[o] then wait = -1 else wait = math.ceil(excess) end
  end
end
local out = {code, which, wait}
for i = 1, n do
  local o = 4 * i - 2
  local step = W / a[o]
  local tat, granted = tats[i], 0
  if code == 0 then
    tat = tat + a[o + 1] * step
    local room = math.floor((W - (tat - now)) / step + 1e-9)
    granted = math.max(math.min(a[o + 2], math.floor(room / SHARE)), 0)
    tat = tat + granted * step
  end
  if code == 0 or a[o + 3] > 0 then store(KEYS[i], tat) end
  out[#out + 1] = granted
  out[#out + 1] = math.max(math.floor((W - (tat - now)) / step + 1e-9), 0)
  out[#out + 1] = math.floor(tat - now)
end
for j = 1, #spend do out[#out + 1] = spend[j] end
for i = 1, #out do out[i] = string.format('%.0f', out[i]) end
return table.concat(out, ',')
"""
)


def grant_args(ask: Ask) -> str:
    """GRANT's one argument: "n", then "limit,need,extra,give" per bucket, then the
    budgets' limits."""
    plan = ask.shape.plan
    nums = [len(ask.takes)]
    for bucket, take in zip(plan.buckets, ask.takes, strict=True):
        nums += (bucket.limit, take.need, take.extra, take.give)
    nums += [budget.limit for budget in plan.budgets]
    return ",".join(map(str, nums))


@dataclass(slots=True, frozen=True)
class BucketGrant:
    """One bucket in GRANT's answer."""

    units: int
    """Extra units granted to the lease (beyond the call's own cost)."""
    remaining: int
    """Room left in the bucket after the grant."""
    reset: float
    """Seconds until the bucket is full again."""


@dataclass(slots=True, frozen=True)
class Granted:
    """GRANT's answer, parsed."""

    code: int
    """OK, or what refused the call: BUCKET or BUDGET."""
    which: int
    """The refusing bucket's or budget's index in the plan."""
    wait: float | None
    """Seconds until the refusing bucket has room; None if the call never fits."""
    buckets: tuple[BucketGrant, ...]
    spend: tuple[int, ...]
    """Each budget's counter, as the script read it."""


def parse_grant(reply: bytes, buckets: int) -> Granted:
    """GRANT's reply (the comment above GRANT), for a plan with ``buckets`` buckets."""
    nums = [int(x) for x in reply.split(b",")]
    code, which, wait = nums[:3]
    end = 3 + 3 * buckets
    grants = tuple(
        BucketGrant(units, remaining, reset / 1e6)
        for units, remaining, reset in zip(nums[3:end:3], nums[4:end:3], nums[5:end:3], strict=True)
    )
    return Granted(
        code=code,
        which=which - 1,
        wait=None if wait < 0 else wait / 1e6,
        buckets=grants,
        spend=tuple(nums[end:]),
    )


# KEYS: k buckets, then spend counters. ARGV: k, then "amount, limit" per bucket (amount:
# units to charge, negative to give back), then units of spend, then a TTL per counter.
SETTLE = (
    NOW
    + """
local k = tonumber(ARGV[1])
for i = 1, k do
  local amount = tonumber(ARGV[2 * i])
  if amount ~= 0 then
    store(KEYS[i], tat_of(KEYS[i]) + amount * W / tonumber(ARGV[2 * i + 1]))
  end
end
local units = ARGV[2 + 2 * k]
if units ~= '0' then
  for j = k + 1, #KEYS do
    redis.call('INCRBY', KEYS[j], units)
    redis.call('EXPIRE', KEYS[j], ARGV[2 + k + j])
  end
end
"""
)


def settle_args(charges: list[Charge], units: int, ttls: list[int]) -> list[int]:
    """SETTLE's ARGV, for a settle's charges, spend and its counters' TTLs."""
    args = [len(charges)]
    for charge in charges:
        args += (charge.amount, charge.limit)
    return [*args, units, *ttls]


@dataclass(slots=True)
class Charge:
    """Units a settle adds to one bucket (negative: gives back)."""

    key: str
    amount: int
    limit: int


# KEYS: the replicas' registrations (a sorted set: replica id -> Redis time, µs). ARGV: this
# replica's id, then how long a registration counts (µs). Reply: how many count now.
HEARTBEAT = (
    NOW
    + """
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl / 1000))
return redis.call('ZCARD', KEYS[1])
"""
)

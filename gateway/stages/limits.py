"""Rate limits and budgets for a keyed call: a limiter check before, a settle after.

Tokens per minute are reserved up front and reconciled after the call: the check charges
the prompt (the prefix stage's exact count, or body bytes / 4 for embeddings) plus
max_tokens, and once the call is done the difference to the usage the backend reported
is added or refunded. So a burst is judged on what it may use, no call waits on a
counter after it ran, and a call without max_tokens that talks long is charged in full,
late. Spend (the call's exact cost) goes to the key's and the team's day and month
counters as the ledger prices it; budgets are checked in the same round trip as limits.

Refusals: over a rate limit, 429 rate_limit_exceeded with Retry-After (the openai client
waits and retries); over a budget, 429 insufficient_quota with ``x-should-retry: false``
(no point retrying before the period ends); while Redis is unreachable with
limits.on_outage: closed, 503 limits_unavailable with Retry-After. The x-ratelimit-*
headers report the tightest of the key's and the team's buckets, on refusals, and on
served calls with auth.ratelimit_headers on.
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Awaitable, Iterable
from datetime import UTC, datetime
from typing import NamedTuple

from gateway.errors import BackendUnavailable, GatewayError, QuotaExceeded, RateLimited
from gateway.flow import Call, Cost, Principal, Quota
from gateway.keys.store import Spend
from gateway.ledger.models import to_units
from gateway.limits import Limiter
from gateway.limits.base import (
    PERIODS,
    Bucket,
    Budget,
    Counter,
    Plan,
    Scope,
    Seed,
    Verdict,
    Window,
    period_end,
    period_id,
)

PLANS = 4096
"""Principals whose plan is kept (a key's principal is new after each key cache reload)."""


class Planned(NamedTuple):
    day: int
    plan: Plan
    quota: Quota
    """The plan's quota without headers, which every call of the plan shares."""


class Plans:
    """Each principal's plan on the UTC day it was last used, so a call finds its plan
    (and the quota its calls share) with one dict lookup; Services owns one."""

    def __init__(self, size: int = PLANS) -> None:
        self._size = size
        self._kept: dict[Principal, Planned] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, principal: Principal, day: int) -> Planned:
        planned = self._kept.get(principal)
        if planned is None or planned.day != day:
            planned = self._anew(principal, day)
        return planned

    def _anew(self, p: Principal, day: int) -> Planned:
        """Build and keep the principal's plan for the day (once per principal and day)."""
        if len(self._kept) >= self._size:
            self._kept.clear()
        plan = plan_for(p, day)
        planned = self._kept[p] = Planned(day, plan, Quota((), plan))
        return planned


def admit(
    call: Call, body_bytes: int, limiter: Limiter, plans: Plans, headers: bool = True
) -> Awaitable[None] | None:
    """Charge the call to its buckets, or refuse it; sets call.quota when admitted (with
    the x-ratelimit-* headers for its response unless ``headers`` is off). Returns None
    when decided here (the common call: no coroutine to build and await), else what to
    await while the store decides."""
    principal = call.principal
    if principal is None or principal.anonymous:
        return None
    prefix, request = call.prefix, call.request
    assert request is not None
    # The prompt's tokens (or a quarter of the body's bytes) and the answer's limit.
    reserved = (prefix.tokens if prefix is not None else body_bytes // 4) + (
        request.max_tokens or 0
    )
    planned = plans.get(principal, int(call.received_wall // 86400))  # the UTC day
    verdict = limiter.check(planned.plan, reserved)
    if verdict is None:
        return _admit_later(call, planned, reserved, limiter, headers)
    _charge(call, verdict, planned, reserved, limiter, headers)
    return None


async def _admit_later(
    call: Call, planned: Planned, reserved: int, limiter: Limiter, headers: bool
) -> None:
    verdict = await limiter.admit(planned.plan, reserved)
    _charge(call, verdict, planned, reserved, limiter, headers)


def _charge(
    call: Call, verdict: Verdict, planned: Planned, reserved: int, limiter: Limiter, headers: bool
) -> None:
    if not verdict.allowed:
        raise refusal(verdict, reserved, limiter)
    call.reserved_tokens = reserved
    if headers:
        call.quota = Quota(raw_ratelimit_headers(verdict), planned.plan)
    else:
        call.quota = planned.quota


def settle(call: Call, cost: Cost, limiter: Limiter) -> None:
    """Reconcile reserved tokens with the usage and add the cost to spend. Never raises."""
    if call.quota is None or call.principal is None:
        return
    u = call.usage
    used = u.prompt_tokens + u.completion_tokens if u else 0
    limiter.settle(call.quota.plan, used - call.reserved_tokens, cost.total)


def plan_for(p: Principal, day: int) -> Plan:
    """The principal's plan on a UTC day (days since the epoch): what its calls ask of the
    limiter. Pure; ``Plans`` keeps it, so the hot path builds one per key and day."""
    assert p.key_id is not None
    assert p.team is not None
    at = datetime.fromtimestamp(day * 86400, UTC)
    owners: tuple[tuple[Scope, str], ...] = (("key", p.key_id), ("team", p.team))
    buckets: list[Bucket] = []
    budgets: list[Budget] = []
    for (scope, owner), rpm, tpm, usd, period in zip(
        owners,
        (p.rpm, p.team_rpm),
        (p.tpm, p.team_tpm),
        (p.budget_usd, p.team_budget_usd),
        (p.budget_period, p.team_budget_period),
        strict=True,
    ):
        if rpm is not None:
            buckets.append(Bucket(scope, "requests", owner, rpm))
        if tpm is not None:
            buckets.append(Bucket(scope, "tokens", owner, tpm))
        if usd is not None:
            counter = Counter(scope, owner, period_id(period, at))
            budgets.append(Budget(counter, to_units(usd), period_end(period, at)))
    counters = tuple(
        Counter(scope, owner, period_id(period, at))
        for scope, owner in owners
        for period in PERIODS
    )
    return Plan(p.team, tuple(buckets), tuple(budgets), counters)


def ratelimit_headers(verdict: Verdict) -> dict[str, str]:
    """OpenAI's x-ratelimit-* headers, from the bucket of each kind with the least room."""
    tightest: dict[str, Window] = {}
    for w in verdict.windows:
        t = tightest.get(w.bucket.kind)
        if t is None or (w.remaining, -w.reset) < (t.remaining, -t.reset):
            tightest[w.bucket.kind] = w
    out: dict[str, str] = {}
    for kind in ("requests", "tokens"):
        window = tightest.get(kind)
        if window is not None:
            out[f"x-ratelimit-limit-{kind}"] = str(window.bucket.limit)
            out[f"x-ratelimit-remaining-{kind}"] = str(window.remaining)
            out[f"x-ratelimit-reset-{kind}"] = duration(window.reset)
    return out


@functools.lru_cache(maxsize=256)
def raw_ratelimit_headers(verdict: Verdict) -> tuple[tuple[bytes, bytes], ...]:
    """The same as the (name, value) bytes an ASGI response carries, built once per verdict
    (the Redis limiter hands one verdict to a plan's calls close together) and taken by a
    served call's response as they are. A verdict is reused for a few milliseconds only,
    so a small cache holds every one still in use; a big one would only keep dead verdicts
    alive for the garbage collector to walk."""
    return tuple((k.encode(), v.encode()) for k, v in ratelimit_headers(verdict).items())


def refusal(verdict: Verdict, tokens: int, limiter: Limiter) -> GatewayError:
    headers = ratelimit_headers(verdict)
    by = verdict.refused_by
    if by is None:  # nothing refused it but an unreachable store (limits.on_outage: closed)
        limiter.metrics.refused.labels("key", "unavailable").inc()
        retry_s = max(math.ceil(verdict.retry_after or 1), 1)
        return BackendUnavailable(
            "Rate limits cannot be checked right now (their store is unreachable); "
            "try again shortly.",
            code="limits_unavailable",
            headers={"retry-after": str(retry_s)},
        )
    if isinstance(by, Budget):
        limiter.metrics.refused.labels(by.counter.scope, "budget").inc()
        period = "day" if by.counter.period_id.startswith("d") else "month"
        return QuotaExceeded(
            f"You exceeded your current quota: the {by.counter.scope}'s budget for this "
            f"{period} is spent (it renews at {by.ends.isoformat()}).",
            headers={**headers, "x-should-retry": "false"},
        )
    assert isinstance(by, Bucket)
    limiter.metrics.refused.labels(by.scope, by.kind).inc()
    if verdict.retry_after is None:
        return RateLimited(
            f"Request too large: it needs {tokens} tokens, the {by.scope}'s limit is "
            f"{by.limit} tokens per minute.",
            headers={**headers, "x-should-retry": "false"},
        )
    wait = verdict.retry_after
    return RateLimited(
        f"Rate limit reached for the {by.scope} on {by.kind} per minute: limit {by.limit}. "
        f"Please try again in {duration(wait)}.",
        headers={
            **headers,
            "retry-after": str(max(math.ceil(wait), 1)),
            "retry-after-ms": str(max(math.ceil(wait * 1000), 1)),
        },
    )


def duration(seconds: float) -> str:
    """OpenAI's reset format: 20ms, 1.5s, 6m0s."""
    if seconds < 1:
        return f"{math.ceil(seconds * 1000)}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def seeds(spends: Iterable[Spend], now: datetime) -> list[Seed]:
    """Spend counters for this day and month from the ledger's aggregate (keys and teams)."""
    units: dict[tuple[Counter, str], int] = defaultdict(int)
    ends: dict[str, datetime] = {}
    for s in spends:
        if s.team is None:
            continue
        for period, amount in zip(PERIODS, (s.today, s.month), strict=True):
            pid = period_id(period, now)
            ends[pid] = period_end(period, now)
            units[(Counter("key", s.key_id, pid), s.team)] += to_units(amount)
            units[(Counter("team", s.team, pid), s.team)] += to_units(amount)
    return [Seed(c, tag, u, ends[c.period_id]) for (c, tag), u in units.items()]

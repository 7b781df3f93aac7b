"""What /ready reports: each part the gateway depends on, and whether calls can be served.

The rule for the status code: 503 only when the gateway can serve no call at all, i.e. no
model has a healthy backend. A store outage the gateway works around is 200 with status
"degraded" and the part named: the ledger spools rows to local disk, keys it confirmed
recently work from their records, routing goes on without the shared index, the limits
are enforced as their outage rule says. Every replica shares those stores, so failing readiness for
them would take every replica out of its Service at once and turn a degraded gateway into
no gateway; a backend-less replica, though, has nothing to offer a call.

The checks use what the gateway already knows (backend health probes, the index's and the
limiter's state, the ledger's spool, the key cache) plus one bounded database ping, so an
answer comes within PING_TIMEOUT even while the database hangs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.services import Services

PING_TIMEOUT = 1.0
"""Seconds the database ping may take (under the 2 s probe timeout of deploy/k8s)."""


async def readiness(svc: Services) -> tuple[bool, dict[str, Any]]:
    """(whether any call can be served, the JSON body /ready answers with)."""
    database = await _database_answers(svc)
    backends = _backends(svc)
    parts = {
        "ledger": _ledger(svc, database),
        "keys": _keys(svc, database),
        "index": _index(svc),
        "limits": _limits(svc),
    }
    serving = any(m["healthy"] for m in backends.values())
    degraded = sorted(n for n, part in parts.items() if part["status"] not in ("ok", "off"))
    degraded += sorted(f"backends:{name}" for name, m in backends.items() if not m["healthy"])
    status = "unavailable" if not serving else "degraded" if degraded else "ready"
    body = {"status": status, "degraded": degraded, "backends": backends, **parts}
    return serving, body


async def _database_answers(svc: Services) -> bool:
    try:
        return await asyncio.wait_for(svc.ledger.ready(), PING_TIMEOUT)
    except TimeoutError:
        return False


def _backends(svc: Services) -> dict[str, dict[str, int]]:
    return {
        name: {"healthy": sum(b.healthy for b in m.backends), "total": len(m.backends)}
        for name, m in svc.backends.models.items()
    }


def _ledger(svc: Services, database: bool) -> dict[str, Any]:
    """ok; or spooling: rows wait on local disk for the database (down, or catching up)."""
    if not svc.settings.ledger.enabled:
        return {"status": "off"}
    spooled = svc.ledger.spooled
    status = "ok" if database and not spooled else "spooling"
    return {"status": status, "database": _reachable(database), "spool_rows": spooled}


def _keys(svc: Services, database: bool) -> dict[str, Any]:
    """ok; or degraded: the key store fails, keys it confirmed within auth.stale_for work
    from their records (how many, and the oldest record's age), others get 503."""
    if not svc.keys.enabled:
        return {"status": "off"}
    stale, age = svc.keys.stale()
    return {
        "status": "ok" if database and not stale else "degraded",
        "store": _reachable(database),
        "stale_keys": stale,
        "oldest_record_seconds": round(age, 1),
    }


def _index(svc: Services) -> dict[str, Any]:
    """ok; or degraded: the shared (Redis) index fails and routing uses this replica's."""
    kind = "redis" if svc.settings.redis.url else "in-process"
    return {"status": "ok" if svc.index.healthy else "degraded", "store": kind}


def _limits(svc: Services) -> dict[str, Any]:
    """ok; or degraded: Redis fails and the limits are not shared (mode: what they do)."""
    kind = "redis" if svc.settings.redis.url else "in-process"
    for metric in svc.limits.metrics.degraded.collect():
        for sample in metric.samples:
            if sample.value:
                return {"status": "degraded", "store": kind, **sample.labels}
    return {"status": "ok", "store": kind}


def _reachable(up: bool) -> str:
    return "reachable" if up else "unreachable"

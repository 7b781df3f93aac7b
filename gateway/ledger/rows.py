"""The ledger row of a finished, priced call: a plain dict keyed by column name.

Strings are cut to their column's length and token counts clamped to the column's range,
so that no single odd call can make a whole batch fail forever (and block the spool).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.flow import Call, Cost, Usage
from gateway.ledger.models import LedgerRow
from gateway.stages.metering import standard_input_tokens

Row = dict[str, Any]

MAX_INT = 2**31 - 1
_LENGTHS = {
    c.name: c.type.length
    for c in LedgerRow.__table__.columns
    if getattr(c.type, "length", None) is not None
}


def _cut(name: str, value: str | None) -> str | None:
    return None if value is None else value[: _LENGTHS[name]]


def _count(n: int) -> int:
    return min(max(n, 0), MAX_INT)


def ledger_row(call: Call, cost: Cost) -> Row:
    usage = call.usage or Usage()
    principal, route, request = call.principal, call.route, call.request
    return {
        "request_id": _cut("request_id", call.id),
        "ts": datetime.fromtimestamp(call.received_wall, UTC),
        "key_id": _cut("key_id", principal.key_id if principal else None),
        "team": _cut("team", principal.team if principal else None),
        "model": _cut("model", call.model),
        "backend": _cut("backend", route.backend if route else None),
        "endpoint": _cut("endpoint", request.endpoint if request else "unknown"),
        "stream": bool(request and request.stream),
        "status": min(max(call.status, 0), 32767),
        "error_type": _cut("error_type", call.error_type),
        "decision": _cut("decision", route.decision if route else None),
        "served_by": _cut("served_by", call.served_by),
        "disconnected": call.disconnected,
        "estimated": usage.estimated,
        "prompt_tokens": _count(usage.prompt_tokens),
        "input_tokens": _count(standard_input_tokens(usage)),
        "cached_tokens": _count(usage.cached_tokens),
        "cache_write_tokens": _count(usage.cache_write_tokens),
        "completion_tokens": _count(usage.completion_tokens),
        "predicted_cached_tokens": _count(route.predicted_cached_tokens if route else 0),
        "price_id": cost.price_id,
        "cost_input": cost.input,
        "cost_cached_input": cost.cached_input,
        "cost_cache_write": cost.cache_write,
        "cost_output": cost.output,
        "cost_total": cost.total,
        "cost_without_cache": cost.without_cache,
        "ttft_s": call.ttft,
        "latency_s": call.latency,
    }


def done_wall(row: Row) -> float:
    """Wall-clock time the call ended (received + latency): where ledger lag starts."""
    return float(row["ts"].timestamp() + (row["latency_s"] or 0.0))

"""The ledger row of a finished, priced call: a named tuple in the table's column order.

A tuple is what COPY takes, so a batch goes to Postgres without reshaping, and building
one costs a fraction of a dict. Strings are cut to their column's length (the Literal-typed
endpoint, decision and served_by are short by construction) and token counts clamped to
the column's range, so that no single odd call can make a whole batch fail forever (and
block the spool).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, NamedTuple

from gateway.flow import ANONYMOUS, Call, Cost, Usage
from gateway.ledger.models import LedgerRow
from gateway.stages.metering import standard_input_tokens

MAX_INT = 2**31 - 1
_LENGTHS = {
    c.name: c.type.length
    for c in LedgerRow.__table__.columns
    if getattr(c.type, "length", None) is not None
}
_NO_USAGE = Usage()


class Row(NamedTuple):
    """One ledger row; money in integer units of 1e-10 USD (as the columns hold it)."""

    request_id: str
    ts: datetime
    key_id: str | None
    team: str | None
    model: str | None
    backend: str | None
    endpoint: str
    stream: bool
    status: int
    error_type: str | None
    decision: str | None
    served_by: str
    disconnected: bool
    estimated: bool
    prompt_tokens: int
    input_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    completion_tokens: int
    predicted_cached_tokens: int
    price_id: int | None
    cost_input: int
    cost_cached_input: int
    cost_cache_write: int
    cost_output: int
    cost_total: int
    cost_without_cache: int
    ttft_s: float | None
    latency_s: float | None

    def values(self) -> dict[str, Any]:
        """Column name -> value, for statements that bind by name."""
        return self._asdict()


def _cut(name: str, value: str | None) -> str | None:
    return None if value is None else value[: _LENGTHS[name]]


def _count(n: int) -> int:
    return n if 0 <= n <= MAX_INT else min(max(n, 0), MAX_INT)


def ledger_row(call: Call, cost: Cost) -> Row:
    usage = call.usage or _NO_USAGE
    principal, route, request = call.principal or ANONYMOUS, call.route, call.request
    return Row(
        call.id[: _LENGTHS["request_id"]],
        datetime.fromtimestamp(call.received_wall, UTC),
        _cut("key_id", principal.key_id),
        _cut("team", principal.team),
        _cut("model", call.model),
        _cut("backend", route.backend) if route else None,
        request.endpoint if request else "unknown",
        bool(request and request.stream),
        min(max(call.status, 0), 32767),
        _cut("error_type", call.error_type),
        route.decision if route else None,
        call.served_by,
        call.disconnected,
        usage.estimated,
        _count(usage.prompt_tokens),
        _count(standard_input_tokens(usage)),
        _count(usage.cached_tokens),
        _count(usage.cache_write_tokens),
        _count(usage.completion_tokens),
        _count(route.predicted_cached_tokens) if route else 0,
        cost.price_id,
        cost.input,
        cost.cached_input,
        cost.cache_write,
        cost.output,
        cost.total,
        cost.without_cache,
        call.ttft,
        call.latency,
    )


def done_wall(row: Row) -> float:
    """Wall-clock time the call ended (received + latency): where ledger lag starts."""
    return row.ts.timestamp() + (row.latency_s or 0.0)

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

from sqlalchemy import String

from gateway.flow import ANONYMOUS, Call, Cost, Usage
from gateway.keys.secret import hash_end_user
from gateway.ledger.models import LedgerRow
from gateway.stages.metering import standard_input_tokens

MAX_INT = 2**31 - 1
_LENGTHS = {
    c.name: c.type.length
    for c in LedgerRow.__table__.columns
    if isinstance(c.type, String) and c.type.length is not None
}
_NO_USAGE = Usage()


class Row(NamedTuple):
    """One ledger row; money in integer units of 1e-10 USD (as the columns hold it), and
    ts the epoch seconds the call was received (the writer's connection encodes that float
    for the timestamptz column, sparing every call the building of a datetime)."""

    request_id: str
    ts: float
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
    client_request_id: str | None = None
    """Last, with a default: rows spooled before the column existed still decode."""
    end_user: str | None = None
    """The app's end user, hashed (keys/secret.py); a default, as client_request_id."""

    def values(self) -> dict[str, Any]:
        """Column name -> value (ts as an aware datetime), for statements that bind by name
        and for the spool."""
        return self._asdict() | {"ts": datetime.fromtimestamp(self.ts, UTC)}


_CUT = ("request_id", "key_id", "team", "model", "backend", "error_type", "client_request_id")
_ID, _KEY, _TEAM, _MODEL, _BACKEND, _ERROR, _CLIENT_ID = (_LENGTHS[n] for n in _CUT)


Counts = tuple[int, int, int, int, int, int]
"""A row's token counts, in column order."""


def _clamped(counts: Counts) -> Counts:
    """The counts held to an integer column's range."""
    prompt, standard, cached, cache_write, completion, predicted = (
        min(max(n, 0), MAX_INT) for n in counts
    )
    return prompt, standard, cached, cache_write, completion, predicted


def ledger_row(call: Call, cost: Cost, end_user_key: bytes = b"") -> Row:
    """The call's row, written flat rather than through a helper per string and count:
    it runs for every call on the event loop, where a dozen small calls add up."""
    usage = call.usage or _NO_USAGE
    principal = call.principal or ANONYMOUS
    route, request = call.route, call.request
    key, team, error = principal.key_id, principal.team, call.error_type
    counts = (usage.prompt_tokens, standard_input_tokens(usage), usage.cached_tokens,
              usage.cache_write_tokens, usage.completion_tokens,
              route.predicted_cached_tokens if route else 0)  # fmt: skip
    if not 0 <= min(counts) <= max(counts) <= MAX_INT:
        counts = _clamped(counts)
    received, first_byte, done = call.received_at, call.first_byte_at, call.done_at
    client_id = call.client_request_id
    end_user = request.end_user if request else None
    return Row(
        call.id[:_ID],
        call.received_wall,
        key and key[:_KEY],
        team and team[:_TEAM],
        request.model[:_MODEL] if request else None,
        route.backend[:_BACKEND] if route else None,
        request.endpoint if request else "unknown",
        request.stream if request else False,
        min(max(call.status, 0), 32767),
        error and error[:_ERROR],
        route.decision if route else None,
        call.served_by,
        call.disconnected,
        usage.estimated,
        *counts,
        cost.price_id,
        cost.input,
        cost.cached_input,
        cost.cache_write,
        cost.output,
        cost.total,
        cost.without_cache,
        None if first_byte is None else first_byte - received,
        None if done is None else done - received,
        client_id and client_id[:_CLIENT_ID],
        end_user and hash_end_user(end_user, end_user_key),
    )


def done_wall(row: Row) -> float:
    """Wall-clock time the call ended (received + latency): where ledger lag starts."""
    return row.ts + (row.latency_s or 0.0)

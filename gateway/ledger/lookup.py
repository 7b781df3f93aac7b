"""Finding calls in the ledger by the x-request-id their client sent (an indexed column).

Clients reuse their ids, so a lookup lists every call sent with it, oldest first, each
with the gateway's own request_id (the x-gateway-request-id its response carried).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.models import LedgerRow, to_usd

FIELDS = ("request_id", "client_request_id", "ts", "key_id", "team", "model", "endpoint",
          "status", "error_type", "prompt_tokens", "completion_tokens", "cost_total")  # fmt: skip
MAX_CALLS = 1000


async def calls_by_client_id(
    engine: AsyncEngine, client_request_id: str, limit: int = MAX_CALLS
) -> list[dict[str, Any]]:
    """The calls sent with this x-request-id, as JSON-ready dicts (money as exact text)."""
    columns = [getattr(LedgerRow, name) for name in FIELDS]
    stmt = (
        select(*columns)
        .where(LedgerRow.client_request_id == client_request_id)
        .order_by(LedgerRow.ts, LedgerRow.id)
        .limit(limit)
    )
    async with engine.connect() as conn:
        found = (await conn.execute(stmt)).all()
    return [_call(dict(zip(FIELDS, r, strict=True))) for r in found]


def _call(row: dict[str, Any]) -> dict[str, Any]:
    return row | {"ts": row["ts"].isoformat(), "cost_total": format(to_usd(row["cost_total"]), "f")}

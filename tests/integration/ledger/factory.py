"""Finished calls built by hand, priced and recorded as the pipeline's end does it."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gateway.flow import Call, Principal, Request, Route, Usage
from gateway.ledger import Ledger
from gateway.settings import Settings, load_settings


def make_call(
    model: str = "alpha",
    *,
    team: str | None = "team-a",
    key: str | None = "key-1",
    usage: Usage | None = None,
    stream: bool = False,
    status: int = 200,
    error_type: str | None = None,
    disconnected: bool = False,
    served_by: Any = "upstream",
    received_wall: float | None = None,
    backend: str = "b1",
) -> Call:
    call = Call(id=f"req-{uuid.uuid4().hex}", path="/v1/chat/completions")
    if received_wall is not None:
        call.received_wall = received_wall
    call.principal = Principal(key_id=key, team=team)
    call.request = Request(endpoint="chat", model=model, body={}, stream=stream)
    call.route = Route(backend=backend, decision="hit", predicted_cached_tokens=0)
    # Mid-way in the reports' 10 ms counts, which a clock's hair either way cannot move.
    call.first_byte_at = call.received_at + 0.105
    call.done_at = call.received_at + 0.505
    call.status, call.error_type = status, error_type
    call.disconnected, call.served_by, call.usage = disconnected, served_by, usage
    return call


def ledger_settings(
    url: str, spool: Path, prices: dict[str, dict[str, str]], **ledger: Any
) -> Settings:
    models = [
        {"name": name, "backends": [{"url": "http://127.0.0.1:9"}], "price": price}
        for name, price in prices.items()
    ]
    return load_settings(
        database={"url": url, "auto_migrate": True, "timeout": 2.0},
        ledger={"spool_dir": str(spool), "flush_interval": 0.01, **ledger},
        models=models,
    )


def record(ledger: Ledger, call: Call) -> None:
    """Price the call and queue its row, the two steps of the pipeline's end."""
    call.cost = ledger.price(call)
    ledger.record(call, call.cost)

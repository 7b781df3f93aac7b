"""The access log: one JSON line per call on the ``gateway.access`` logger.

It says who called what and how it went (status, tokens, timings, cost), with the key's
id, never the key, and never the prompt or the reply.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import orjson

from gateway.flow import Call
from gateway.ledger.models import to_usd

log = logging.getLogger("gateway.access")


def write(call: Call) -> None:
    """One JSON line per call: the key's id, never the key; never the prompt."""
    if not log.isEnabledFor(logging.INFO):
        return
    u, cost = call.usage, call.cost
    line = {
        "ts": datetime.fromtimestamp(call.received_wall, UTC).isoformat(timespec="milliseconds"),
        "request_id": call.id,
        "client_request_id": call.client_request_id,
        "key_id": call.principal.key_id if call.principal else None,
        "team": call.principal.team if call.principal else None,
        "model": call.model,
        "endpoint": call.request.endpoint if call.request else None,
        "backend": call.route.backend if call.route else None,
        "decision": call.route.decision if call.route else None,
        "status": call.status,
        "error": call.error_type,
        "stream": call.request.stream if call.request else None,
        "prompt_tokens": u.prompt_tokens if u else None,
        "cached_tokens": u.cached_tokens if u else None,
        "completion_tokens": u.completion_tokens if u else None,
        "estimated": u.estimated if u else None,
        "ttft_ms": round(call.ttft * 1000, 2) if call.ttft is not None else None,
        "latency_ms": round(call.latency * 1000, 2) if call.latency is not None else None,
        "overhead_ms": round(call.overhead * 1000, 3) if call.overhead is not None else None,
        "cost_usd": format(to_usd(cost.total), "f") if cost else None,
        "disconnected": call.disconnected,
        "served_by": call.served_by,
    }
    log.info(orjson.dumps(line).decode())

"""The access log: one JSON line per call, on stdout by default.

It says who called what and how it went (status, tokens, timings, cost), with the key's
id, never the key, and never the prompt or the reply.

A line is a call's last and cheapest step, so it skips the logging module (a record, a
caller lookup, a handler lock and a flush per line cost a small call a sixth of its CPU):
lines gather in memory and go out once per event-loop turn. Each write holds whole lines
and at most PIPE_BUF bytes (unless one line is longer), which POSIX makes atomic on a
pipe: worker processes sharing one stdout never interleave within a line.
"""

from __future__ import annotations

import asyncio
import logging
import os
import select
import sys
from datetime import UTC, datetime

import orjson

from gateway.flow import Call
from gateway.ledger.models import to_usd

log = logging.getLogger(__name__)

PIPE_BUF = select.PIPE_BUF
STDOUT = 1


class AccessLog:
    """The access lines of one process, to the file descriptor ``fd`` (None: off)."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd
        self._lines: list[bytes] = []
        self._second = -1
        self._stamp = ""
        self._failing = False

    @classmethod
    def to_stdout(cls, enabled: bool) -> AccessLog:
        if not enabled:
            return cls(None)
        sys.stdout.flush()  # what print and logging hold goes first
        return cls(STDOUT)

    def write(self, call: Call) -> None:
        if self._fd is None:
            return
        self._lines.append(orjson.dumps(self._fields(call), option=orjson.OPT_APPEND_NEWLINE))
        if len(self._lines) == 1:
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Write the lines gathered, in writes of whole lines of at most PIPE_BUF bytes.

        A write that fails (a closed pipe, a full disk) drops the lines: they are a log,
        and the ledger holds every call. Said once, until a write succeeds again."""
        lines, self._lines = self._lines, []
        chunk = b""
        try:
            for line in lines:
                if chunk and len(chunk) + len(line) > PIPE_BUF:
                    self._write(chunk)
                    chunk = b""
                chunk += line
            if chunk:
                self._write(chunk)
        except OSError as exc:
            if not self._failing:
                log.warning("access log: write failed (%s); lines are dropped meanwhile", exc)
            self._failing = True
        else:
            self._failing = False

    def _write(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def _fields(self, call: Call) -> dict[str, object]:
        """The key's id, never the key; never the prompt."""
        u, cost, route = call.usage, call.cost, call.route
        forecast = route.expected_ttft if route is not None else 0.0  # cache-aware's only
        return {
            "ts": self._timestamp(call.received_wall),
            "request_id": call.id,
            "client_request_id": call.client_request_id,
            "key_id": call.principal.key_id if call.principal else None,
            "team": call.principal.team if call.principal else None,
            "model": call.model,
            "endpoint": call.request.endpoint if call.request else None,
            "backend": route.backend if route else None,
            "decision": route.decision if route else None,
            "status": call.status,
            "error": call.error_type,
            "stream": call.request.stream if call.request else None,
            "prompt_tokens": u.prompt_tokens if u else None,
            "cached_tokens": u.cached_tokens if u else None,
            "completion_tokens": u.completion_tokens if u else None,
            "estimated": u.estimated if u else None,
            "ttft_ms": round(call.ttft * 1000, 2) if call.ttft is not None else None,
            "ttft_forecast_ms": round(forecast * 1000, 2) if forecast > 0 else None,
            "latency_ms": round(call.latency * 1000, 2) if call.latency is not None else None,
            "overhead_ms": round(call.overhead * 1000, 3) if call.overhead is not None else None,
            "cost_usd": format(to_usd(cost.total), "f") if cost else None,
            "disconnected": call.disconnected,
            "served_by": call.served_by,
        }

    def _timestamp(self, wall: float) -> str:
        """ISO 8601 in UTC to the millisecond, the date and time of day formatted once a
        second rather than once a call."""
        second = int(wall)
        if second != self._second:
            moment = datetime.fromtimestamp(second, UTC)
            self._second, self._stamp = second, moment.strftime("%Y-%m-%dT%H:%M:%S")
        return f"{self._stamp}.{int((wall - second) * 1000):03d}+00:00"

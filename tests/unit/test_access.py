"""The access log: one JSON line per call, without the key."""

from __future__ import annotations

import logging

import orjson
import pytest

from gateway import access
from gateway.flow import Call, Cost, Principal, Request, Route, Usage


def finished_call(stream: bool) -> Call:
    call = Call(
        id="req-1", path="/v1/chat/completions", headers={"authorization": "Bearer gk-s3cret"}
    )
    call.principal = Principal(key_id="key-7", team="search")
    call.request = Request(endpoint="chat", model="m", body={"messages": []}, stream=stream)
    call.route = Route(backend="b1", decision="hit", predicted_cached_tokens=32)
    call.dispatched_at = call.received_at + 0.002
    call.first_byte_at = call.received_at + 0.05
    call.done_at = call.received_at + 0.25
    call.usage = Usage(prompt_tokens=100, cached_tokens=64, completion_tokens=9)
    call.cost = Cost(total=1_234_000)  # 1e-10 USD units
    return call


def test_access_log_is_one_json_line_without_the_key(caplog: pytest.LogCaptureFixture) -> None:
    call = finished_call(stream=True)
    call.overhead = 0.0021
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        access.write(call)
    [record] = caplog.records
    line = record.getMessage()
    assert "\n" not in line
    assert "s3cret" not in line
    entry = orjson.loads(line)
    assert entry["request_id"] == "req-1"
    assert entry["key_id"] == "key-7"
    assert entry["team"] == "search"
    assert (entry["model"], entry["backend"], entry["status"]) == ("m", "b1", 200)
    assert (entry["prompt_tokens"], entry["cached_tokens"], entry["completion_tokens"]) == (
        100,
        64,
        9,
    )
    assert entry["ttft_ms"] == pytest.approx(50, abs=0.01)
    assert entry["latency_ms"] == pytest.approx(250, abs=0.01)
    assert entry["overhead_ms"] == 2.1
    assert entry["cost_usd"] == "0.0001234000"
    assert entry["ts"].endswith("+00:00")


def test_access_log_off_costs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.access"):
        access.write(finished_call(stream=False))
    assert caplog.records == []

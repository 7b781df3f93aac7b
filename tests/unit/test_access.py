"""The access log: one JSON line per call, without the key, written a loop turn at a time
in whole lines of at most PIPE_BUF bytes."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from gateway.access import PIPE_BUF, AccessLog
from gateway.flow import Call, Cost, Principal, Request, Route, Usage


def finished_call(stream: bool) -> Call:
    call = Call(
        id="req-1", path="/v1/chat/completions", headers={"authorization": "Bearer gk-s3cret"}
    )
    call.principal = Principal(key_id="key-7", team="search")
    call.request = Request(endpoint="chat", model="m", body={"messages": []}, stream=stream)
    call.route = Route(
        backend="b1", decision="hit", predicted_cached_tokens=32, expected_ttft=0.04125
    )
    call.dispatched_at = call.received_at + 0.002
    call.first_byte_at = call.received_at + 0.05
    call.done_at = call.received_at + 0.25
    call.usage = Usage(prompt_tokens=100, cached_tokens=64, completion_tokens=9)
    call.cost = Cost(total=1_234_000)  # 1e-10 USD units
    return call


@pytest.fixture
def out(tmp_path: Path) -> Iterator[tuple[AccessLog, Path]]:
    path = tmp_path / "access.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    yield AccessLog(fd), path
    os.close(fd)


async def test_access_log_is_one_json_line_without_the_key(out: tuple[AccessLog, Path]) -> None:
    log, path = out
    call = finished_call(stream=True)
    call.overhead = 0.0021
    call.received_wall = 1_765_000_000.123456
    log.write(call)
    assert path.read_bytes() == b""  # held until the loop's turn ends
    await asyncio.sleep(0)
    [line] = path.read_bytes().splitlines()
    assert b"s3cret" not in line
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
    assert entry["ttft_forecast_ms"] == 41.25  # what routing expected, beside what came
    assert entry["latency_ms"] == pytest.approx(250, abs=0.01)
    assert entry["overhead_ms"] == 2.1
    assert entry["cost_usd"] == "0.0001234000"
    wall = datetime.fromtimestamp(call.received_wall, UTC)
    assert entry["ts"] == wall.isoformat(timespec="milliseconds") == "2025-12-06T05:46:40.123+00:00"


async def test_a_call_routing_made_no_forecast_for_has_none(out: tuple[AccessLog, Path]) -> None:
    """Round robin and least loaded forecast nothing; a call refused before routing has
    no route at all."""
    log, path = out
    unforecast, refused = finished_call(stream=False), finished_call(stream=False)
    unforecast.route = Route(backend="b1", decision="none")
    refused.route, refused.status = None, 429
    log.write(unforecast)
    log.write(refused)
    await asyncio.sleep(0)
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert [(e["backend"], e["ttft_forecast_ms"]) for e in lines] == [("b1", None), (None, None)]


async def test_timestamps_follow_the_clock_across_seconds(out: tuple[AccessLog, Path]) -> None:
    log, path = out
    walls = [1_765_000_000.999, 1_765_000_001.0, 1_765_000_001.5, 1_765_000_000.25]
    for wall in walls:
        call = finished_call(stream=False)
        call.received_wall = wall
        log.write(call)
    await asyncio.sleep(0)
    stamps = [orjson.loads(line)["ts"] for line in path.read_bytes().splitlines()]
    assert stamps == [
        datetime.fromtimestamp(w, UTC).isoformat(timespec="milliseconds") for w in walls
    ]


async def test_a_turns_lines_go_out_in_whole_lines_of_at_most_pipe_buf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "access.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    writes: list[bytes] = []

    def write(to: int, data: memoryview) -> int:
        if to == fd:
            writes.append(bytes(data))
        return real(to, data)

    real = os.write
    monkeypatch.setattr(os, "write", write)
    log = AccessLog(fd)
    calls = [finished_call(stream=False) for _ in range(40)]
    for i, call in enumerate(calls):
        call.id = f"req-{i}"
        log.write(call)
    await asyncio.sleep(0)
    os.close(fd)
    assert 1 < len(writes) < len(calls)
    assert all(len(w) <= PIPE_BUF and w.endswith(b"\n") for w in writes)
    ids = [orjson.loads(line)["request_id"] for line in path.read_bytes().splitlines()]
    assert ids == [c.id for c in calls]


async def test_a_failed_write_drops_the_lines_says_so_once_and_recovers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    read, write = os.pipe()
    os.close(read)  # every write now fails: EPIPE
    log = AccessLog(write)
    with caplog.at_level(logging.WARNING, logger="gateway.access"):
        for _ in range(2):
            log.write(finished_call(stream=False))
            await asyncio.sleep(0)
    assert len(caplog.records) == 1
    assert "write failed" in caplog.records[0].getMessage()
    path = tmp_path / "access.jsonl"
    file = os.open(path, os.O_WRONLY | os.O_CREAT)
    os.dup2(file, write)  # the log's descriptor now names a file that takes writes
    os.close(file)
    with caplog.at_level(logging.WARNING, logger="gateway.access"):
        log.write(finished_call(stream=False))
        await asyncio.sleep(0)
    os.close(write)
    assert len(path.read_bytes().splitlines()) == 1
    assert len(caplog.records) == 1


def test_access_log_off_costs_nothing() -> None:
    AccessLog(None).write(finished_call(stream=False))  # no loop, no descriptor: no work

from __future__ import annotations

import fcntl
from pathlib import Path

import orjson

from gateway.ledger.rows import Row
from gateway.ledger.spool import Spool, decode, encode


def row(i: int) -> Row:
    return Row(
        request_id=f"r{i}", ts=1_800_000_000.25 + i, key_id="k",
        team=None, model="m", backend="b", endpoint="chat", stream=True, status=200,
        error_type=None, decision="hit", served_by="upstream", disconnected=False,
        estimated=False, prompt_tokens=10, input_tokens=4, cached_tokens=6,
        cache_write_tokens=0, completion_tokens=5, predicted_cached_tokens=6, price_id=3,
        cost_input=1, cost_cached_input=0, cost_cache_write=0, cost_output=125_000_000_000,
        cost_total=125_000_000_001, cost_without_cache=10**10, ttft_s=0.25, latency_s=None,
    )  # fmt: skip


def drain(spool: Spool, limit: int = 2) -> list[str]:
    ids = []
    while (chunk := spool.read(limit)) is not None:
        ids += [r.request_id for r in chunk.rows]
        spool.commit(chunk)
    return ids


def test_rows_round_trip_exactly_in_order(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.open()
    spool.append([row(1), row(2), row(3)])
    spool.append([row(4)])
    assert spool.rows == 4
    chunk = spool.read(10)
    assert chunk is not None
    assert chunk.rows == [row(1), row(2), row(3), row(4)]
    spool.commit(chunk)
    assert (spool.rows, spool.read(10)) == (0, None)
    spool.close()
    assert list(tmp_path.iterdir()) == []


def test_uncommitted_rows_survive_for_the_next_process(tmp_path: Path) -> None:
    first = Spool(tmp_path)
    first.open()
    first.append([row(1), row(2), row(3)])
    chunk = first.read(1)
    assert chunk is not None
    first.commit(chunk)
    first.read(1)  # read but never committed: the database may not have it
    first.close()

    second = Spool(tmp_path)
    second.open()
    # the whole file is replayed: the ledger ignores request ids it already holds
    assert second.rows == 3
    assert drain(second) == ["r1", "r2", "r3"]
    second.close()
    assert list(tmp_path.iterdir()) == []


def test_a_live_processs_file_is_not_adopted(tmp_path: Path) -> None:
    live = tmp_path / "123-live.spool"
    live.write_bytes(encode([row(1)]))
    with live.open("rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        spool = Spool(tmp_path)
        spool.open()
        assert spool.rows == 0
        spool.close()
    assert live.exists()


def test_torn_last_line_is_dropped(tmp_path: Path) -> None:
    (tmp_path / "1-old.spool").write_bytes(encode([row(1), row(2)]) + b'{"request_id": "r3", "t')
    spool = Spool(tmp_path)
    spool.open()
    assert drain(spool) == ["r1", "r2"]
    assert spool.rows == 0
    spool.close()
    assert list(tmp_path.iterdir()) == []


def test_a_row_spooled_with_usd_money_replays_in_units(tmp_path: Path) -> None:
    """A spool left by a gateway from before migration 0004 held money as USD strings."""
    old = row(1).values() | {"ts": "2027-01-15T08:00:01.250000+00:00", "cost_input": "0.0000000001",
                              "cost_cached_input": "0E-10", "cost_cache_write": "0",
                              "cost_output": "12.5000000000", "cost_total": "12.5000000001",
                              "cost_without_cache": "1.0000000000"}  # fmt: skip
    assert decode(orjson.dumps(old)) == row(1)

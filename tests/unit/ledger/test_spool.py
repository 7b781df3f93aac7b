from __future__ import annotations

import fcntl
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

from gateway.ledger.rows import Row
from gateway.ledger.spool import Spool, encode


def row(i: int) -> Row:
    return {"request_id": f"r{i}", "ts": datetime(2026, 11, 29, 12, 0, i, 250, tzinfo=UTC),
            "cost_input": Decimal("0.0000000001"), "cost_cached_input": Decimal(0),
            "cost_cache_write": Decimal(0), "cost_output": Decimal("12.5"),
            "cost_total": Decimal("12.5000000001"), "cost_without_cache": Decimal(1),
            "team": None, "stream": True}  # fmt: skip


def drain(spool: Spool, limit: int = 2) -> list[str]:
    ids = []
    while (chunk := spool.read(limit)) is not None:
        ids += [r["request_id"] for r in chunk.rows]
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

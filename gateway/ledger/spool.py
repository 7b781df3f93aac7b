"""A durable local spool for ledger rows the database could not take.

Each process appends to its own file (``<pid>-<random>.spool`` under ledger.spool_dir,
held with an exclusive flock), one JSON row per line. Every append is flushed and
fsync'd before the writer moves on, so a spooled row survives a crash or power loss.
At start a process adopts every file no live process holds (a crashed or stopped
gateway's), and rows are replayed oldest file first, in line order. Replaying is
idempotent (the ledger ignores a request_id it already has), so a replay cut short by a
crash is simply repeated; a torn last line from a crash mid-append is skipped.
"""

from __future__ import annotations

import fcntl
import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

import orjson

from gateway.ledger.models import ROW_COLUMNS, to_units
from gateway.ledger.rows import Row

log = logging.getLogger(__name__)

_MONEY = frozenset(n for n in ROW_COLUMNS if n.startswith("cost_"))


def encode(rows: Sequence[Row]) -> bytes:
    return b"".join(orjson.dumps(r.values(), default=str) + b"\n" for r in rows)


def decode(line: bytes) -> Row:
    return row_from(orjson.loads(line))


def row_from(row: dict[str, Any]) -> Row:
    """A row from its JSON values (ts as ISO text); money in USD strings (spooled before
    migration 0004) becomes units."""
    row["ts"] = datetime.fromisoformat(row["ts"]).timestamp()
    for name in _MONEY:
        if isinstance(row[name], str):
            row[name] = to_units(Decimal(row[name]))
    return Row(**row)


@dataclass(slots=True)
class _File:
    path: Path
    handle: IO[bytes]
    rows: int
    offset: int = 0
    own: bool = False


@dataclass(frozen=True, slots=True)
class Chunk:
    """Rows read from one spool file, to be committed once the database has them."""

    rows: list[Row]
    file: _File
    end: int
    lines: int


class Spool:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._files: list[_File] = []
        self.rows = 0

    def open(self) -> None:
        """Adopt orphaned spool files (oldest first) and create this process's own."""
        self._dir.mkdir(parents=True, exist_ok=True)
        for path in sorted(self._dir.glob("*.spool"), key=lambda p: p.stat().st_mtime):
            handle = path.open("r+b")
            if not _try_lock(handle):
                handle.close()
                continue
            lines = handle.read().count(b"\n")
            self._files.append(_File(path, handle, lines))
            self.rows += lines
        own = self._dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.spool"
        handle = own.open("a+b")
        _try_lock(handle)
        self._files.append(_File(own, handle, 0, own=True))
        _fsync_dir(self._dir)
        if self.rows:
            log.warning("ledger spool: %d rows from an earlier run will be replayed", self.rows)

    def append(self, rows: Sequence[Row]) -> None:
        """Append durably (write, flush, fsync): blocking, so callers run it in a thread."""
        own = self._files[-1]
        own.handle.seek(0, os.SEEK_END)
        own.handle.write(encode(rows))
        own.handle.flush()
        os.fsync(own.handle.fileno())
        own.rows += len(rows)
        self.rows += len(rows)

    def read(self, limit: int) -> Chunk | None:
        """Up to ``limit`` rows from the oldest file with any left; None if empty."""
        f = next((f for f in self._files if f.rows), None)
        if f is None:
            return None
        f.handle.seek(f.offset)
        rows: list[Row] = []
        lines, end = 0, f.offset
        while len(rows) < limit:
            line = f.handle.readline()
            if not line.endswith(b"\n"):
                break
            end += len(line)
            lines += 1
            try:
                rows.append(decode(line))
            except (ValueError, KeyError, TypeError) as exc:
                log.error("ledger spool %s: unreadable line skipped: %s", f.path, exc)
        if lines == 0:  # only a torn tail is left: a crash cut that append short
            log.error("ledger spool %s: torn last line dropped", f.path)
            self._consumed(f)
            return self.read(limit)
        return Chunk(rows, f, end, lines)

    def commit(self, chunk: Chunk) -> None:
        """The database has the chunk: move past it, and retire a file that is done."""
        f = chunk.file
        f.offset = chunk.end
        f.rows -= chunk.lines
        self.rows -= chunk.lines
        if f.rows <= 0:
            self._consumed(f)

    def _consumed(self, f: _File) -> None:
        self.rows -= max(f.rows, 0)
        f.rows, f.offset = 0, 0
        if f.own:
            f.handle.truncate(0)
            return
        f.path.unlink(missing_ok=True)
        f.handle.close()
        self._files.remove(f)

    def close(self) -> None:
        """Release the files; an own file still holding rows stays for the next start."""
        for f in self._files:
            if f.own and f.rows == 0:
                f.path.unlink(missing_ok=True)
            f.handle.close()
        self._files.clear()


def _try_lock(handle: IO[bytes]) -> bool:
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""The ledger writer: one task that moves rows from memory to the database in batches.

Calls only append to an in-memory queue. The writer sleeps while nothing is queued; with
rows queued it waits flush_interval for more (or until a full batch waits) and inserts up
to batch_size rows in one statement. When the database fails, the batch goes to the
durable spool, and while the spool holds rows every new row queues behind them there, so
rows reach the database in the order they were recorded; the spool is replayed chunk by
chunk as soon as the database answers again.

An outage and a bad row are told apart by the error (gateway.ledger.db.refused_content).
A batch the database refuses for what its rows hold is cut in halves until the refused
rows stand alone; those are set aside as dead letters (gateway.ledger.deadletters) and
every other row is written, in order. So one row no column can take never holds up the
rows behind it, live or in the spool's replay.

Crash bound: a hard crash (kill -9, power loss) loses only rows not yet committed or
fsync'd to the spool: those recorded since the writer last finished a step, i.e. the last
flush_interval (50 ms by default) plus the duration of the batch write in flight (a few
ms normally; at most database.timeout, 5 s by default, while a database hangs). A clean
shutdown (aclose) loses nothing: the queue is written, or spooled if the database fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from itertools import chain

from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger import deadletters
from gateway.ledger.db import DB_ERRORS, refused_content
from gateway.ledger.metrics import LedgerMetrics
from gateway.ledger.rows import Row, done_wall
from gateway.ledger.spool import Spool
from gateway.ledger.store import RowSink
from gateway.settings import LedgerSettings

log = logging.getLogger(__name__)

RETRY_MIN = 0.1
RETRY_MAX = 5.0
"""Backoff bounds between attempts to reach a database that failed."""

OnWritten = Callable[[Sequence[Row]], None]
"""Called with the rows each committed batch added (never a duplicate): e.g. budget spend."""


class LedgerWriter:
    def __init__(
        self,
        engine: AsyncEngine,
        spool: Spool,
        settings: LedgerSettings,
        metrics: LedgerMetrics,
        on_written: OnWritten | None = None,
    ) -> None:
        self._engine = engine
        self._sink = RowSink(engine)
        self._spool = spool
        self._settings = settings
        self._metrics = metrics
        self._on_written = on_written
        self._queue: deque[Row] = deque()
        self._wake = asyncio.Event()
        self._closing = False
        self._retry = 0.0
        self._next_attempt = 0.0
        self._task: asyncio.Task[None] | None = None

    @property
    def depth(self) -> int:
        return len(self._queue)

    def put(self, row: Row) -> None:
        """Queue a row (the depth gauge follows at the writer's next wake-up); the first
        of a batch wakes an idle writer, a full batch one gathering more."""
        self._queue.append(row)
        queued = len(self._queue)
        if queued == 1 or queued >= self._settings.batch_size:
            self._wake.set()

    def start(self) -> None:
        self._metrics.spool_rows.set(self._spool.rows)
        self._task = asyncio.create_task(self._run(), name="ledger-writer")

    async def aclose(self) -> None:
        """Write (or spool) everything still queued, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task
            self._task = None

    async def _run(self) -> None:
        while not self._closing:
            await self._wait()
            try:
                await self._step()
            except Exception:
                # The writer must outlive any surprise, or rows pile up in memory unseen.
                log.exception("ledger writer step failed; retrying")
                await asyncio.sleep(RETRY_MAX)
        while self._queue:
            batch = self._take()
            left = batch if self._spool.rows else await self._write(batch)
            if left:
                await self._to_spool(left)
        await self._sink.aclose()

    def _may_retry(self) -> bool:
        return time.monotonic() >= self._next_attempt

    async def _wait(self) -> None:
        """Until there is a step to take: a spool due for replay, or rows queued, gathered
        for flush_interval or until a batch is full. Nothing queued, no timer: an idle
        gateway's writer costs nothing until a row comes."""
        if self._spool.rows and self._may_retry():
            return
        if not self._queue and not self._spool.rows:
            await self._wake.wait()
        self._wake.clear()
        if len(self._queue) < self._settings.batch_size and not self._closing:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._settings.flush_interval)
            self._wake.clear()
        self._metrics.queue_depth.set(len(self._queue))

    async def _step(self) -> None:
        if self._spool.rows:
            if self._queue:
                await self._to_spool(self._take(len(self._queue)))
            if self._may_retry():
                await self._replay()
        elif self._queue:
            left = await self._write(self._take())
            if left:
                await self._to_spool(left)

    async def _replay(self) -> None:
        chunk = self._spool.read(self._settings.batch_size)
        if chunk is None:
            return
        if not await self._write(chunk.rows, replay=True):
            self._spool.commit(chunk)
            self._metrics.spool_rows.set(self._spool.rows)
            if not self._spool.rows:
                log.warning("ledger spool replayed: the database has every row again")

    def _take(self, n: int | None = None) -> list[Row]:
        n = min(n or self._settings.batch_size, len(self._queue))
        batch = [self._queue.popleft() for _ in range(n)]
        self._metrics.queue_depth.set(len(self._queue))
        return batch

    async def _write(self, rows: list[Row], replay: bool = False) -> list[Row]:
        """Insert one batch; returns the rows still to write (to spool): none when every
        row is in the database or set aside, else those from the first failed write on.

        A batch refused for its content is cut in halves, first half first, until each
        refused row stands alone and goes to the dead letters.
        """
        parts = [rows] if rows else []
        while parts:
            part = parts.pop()
            try:
                new = await self._sink.insert(part)
            except Exception as exc:  # noqa: BLE001 (any failure keeps the rows: _failed logs it)
                if refused_content(exc) and len(part) > 1:
                    half = len(part) // 2
                    parts += (part[half:], part[:half])
                    continue
                if not (refused_content(exc) and await self._set_aside(part[0], exc)):
                    self._failed(exc)
                    return [*part, *chain.from_iterable(reversed(parts))]
                continue
            self._written(part, new, replay)
        return []

    def _written(self, rows: list[Row], new: list[Row], replay: bool) -> None:
        """Count a committed write.

        A replayed batch counts every row as written, the new ones and those already there:
        a spooled row was never counted, and one already there was committed by the write
        that failed to answer (the connection cut after the commit), which counted nothing.
        """
        self._retry = 0.0
        self._metrics.rows_written.inc(len(rows) if replay else len(new))
        self._metrics.lag.set(max(time.time() - done_wall(rows[0]), 0.0))  # queued first: oldest
        if self._on_written is not None and new:
            self._on_written(new)

    def _failed(self, exc: Exception) -> None:
        """The database is away (or something unforeseen failed): back off, then retry."""
        # An error no database raises is a bug or a schema this gateway does not know (an
        # old gateway left running after `gateway migrate`): the rows still go to the
        # spool, never nowhere, and wait there for a gateway that can write them.
        self._metrics.write_failures.inc()
        if not isinstance(exc, DB_ERRORS):
            log.error("ledger write failed unexpectedly, spooling", exc_info=exc)
        elif not self._retry:
            log.error("ledger database write failed, spooling: %s", exc)
        self._retry = min(max(self._retry * 2, RETRY_MIN), RETRY_MAX)
        self._next_attempt = time.monotonic() + self._retry

    async def _set_aside(self, row: Row, exc: Exception) -> bool:
        """Put a refused row in the dead letters; False if that failed too (spool it)."""
        letter = deadletters.letter(row, exc, datetime.now(UTC))
        try:
            await deadletters.set_aside(self._engine, [letter])
            waiting = await deadletters.count(self._engine)
        except Exception:
            log.exception("ledger: could not set aside a refused row, spooling it")
            return False
        log.error(
            "ledger row %s refused by the database for its content, set aside: %s",
            letter["request_id"], letter["error"],
        )  # fmt: skip
        self._metrics.dead_letters.inc()
        self._metrics.dead_letter_rows.set(waiting)
        return True

    async def _to_spool(self, rows: list[Row]) -> None:
        try:
            await asyncio.to_thread(self._spool.append, rows)
        except OSError:
            self._queue.extendleft(reversed(rows))  # keep them: the next step tries again
            raise
        self._metrics.spool_rows.set(self._spool.rows)

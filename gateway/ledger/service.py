"""The ledger as the gateway core sees it: price a finished call and record it, never blocking.

Lifecycle: ``start()`` opens the database (migrating SQLite, or whenever
database.auto_migrate is set; Postgres otherwise must already be at head), writes the
configured prices that changed, loads every price version into memory, adopts the spool
of an earlier run and starts the writer. ``price()`` then costs a call from memory and
``record()`` queues its row; ``aclose()`` writes or spools what is queued.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from prometheus_client import CollectorRegistry
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.flow import Call, Cost
from gateway.keys.secret import end_user_key
from gateway.ledger import deadletters, store
from gateway.ledger.db import DB_ERRORS, LedgerUnavailable, make_engine, ping, safe_url
from gateway.ledger.lookup import calls_by_client_id
from gateway.ledger.metrics import LedgerMetrics
from gateway.ledger.migrate import ensure_schema
from gateway.ledger.prices import PriceBook, PriceVersion, config_changes
from gateway.ledger.report import GroupBy, Report, cost_report
from gateway.ledger.rows import ledger_row
from gateway.ledger.spool import Spool
from gateway.ledger.writer import LedgerWriter, OnWritten
from gateway.settings import Settings
from gateway.stages.metering import price_usage

log = logging.getLogger(__name__)


class Ledger:
    def __init__(
        self,
        settings: Settings,
        registry: CollectorRegistry,
        on_written: OnWritten | None = None,
    ) -> None:
        self._settings = settings
        self._metrics = LedgerMetrics(registry)
        self._models = frozenset(m.name for m in settings.models)
        self._end_user_key = end_user_key(settings.auth.pepper)
        self._on_written = on_written
        self._book = PriceBook()
        self._engine: AsyncEngine | None = None
        self._spool = Spool(settings.ledger.spool_dir)
        self._writer: LedgerWriter | None = None
        self._refresher: asyncio.Task[None] | None = None

    @property
    def engine(self) -> AsyncEngine:
        if self._engine is None:
            raise RuntimeError("Ledger.start() has not run")
        return self._engine

    async def start(self) -> None:
        db = self._settings.database
        self._engine = make_engine(db.url, db.timeout)
        try:
            await self._open_database()
        except DB_ERRORS as exc:
            raise LedgerUnavailable(f"ledger database {safe_url(db.url)}: {exc}") from exc
        self._refresher = asyncio.create_task(self._refresh(), name="ledger-refresh")
        if self._settings.ledger.enabled:
            self._spool.open()
            self._writer = LedgerWriter(
                self._engine, self._spool, self._settings.ledger, self._metrics, self._on_written
            )
            self._writer.start()

    async def _open_database(self) -> None:
        auto = self._settings.database.auto_migrate
        if auto is None:
            auto = self.engine.dialect.name == "sqlite"
        await ensure_schema(self.engine, auto)
        await self.reload_prices()
        now = datetime.now(UTC)
        for model, p in config_changes(self._book, self._settings.models, now):
            prices = (p.input, p.cached_input, p.cache_write, p.output)
            await store.add_price(self.engine, model, now, prices, "config", now)
        await self.reload_prices()

    def price(self, call: Call) -> Cost:
        """The call's cost at the price in force when it arrived (a stream that outlives a
        price change is billed as it began)."""
        return price_usage(call.usage, self._book.at(call.model, call.received_wall))

    def record(self, call: Call, cost: Cost) -> None:
        """Queue the call's ledger row, at ``cost``. Never blocks or raises."""
        try:
            team = call.principal.team if call.principal else None
            if call.model in self._models:  # a client's made-up name is no label value
                self._metrics.add_cost(call.model or "", team or "", cost.total)
            if self._writer is not None:
                self._writer.put(ledger_row(call, cost, self._end_user_key))
        except Exception:
            log.exception("ledger: could not record call %s", call.id)

    def prices_for(self, model: str, at: float | None = None) -> PriceVersion | None:
        """The price version in force for ``model`` at epoch ``at`` (default: now)."""
        when = datetime.now(UTC).timestamp() if at is None else at
        return self._book.at(model, when)

    def price_history(self, model: str | None = None) -> list[PriceVersion]:
        return self._book.history(model)

    async def set_price(
        self,
        model: str,
        prices: tuple[Decimal, Decimal, Decimal, Decimal],
        effective_from: datetime | None = None,
    ) -> PriceVersion:
        """Add a price version (from now unless later) and start using it at once here."""
        now = datetime.now(UTC)
        if effective_from is not None and effective_from.tzinfo is None:
            effective_from = effective_from.replace(tzinfo=UTC)
        start = max(effective_from or now, now)
        await store.add_price(self.engine, model, start, prices, "admin", now)
        await self.reload_prices()
        version = self._book.at(model, start.timestamp())
        assert version is not None
        return version

    async def report(
        self, start: datetime | None, end: datetime | None, group_by: tuple[GroupBy, ...]
    ) -> Report:
        return await cost_report(self.engine, start, end, group_by)

    async def calls_by_client_id(self, client_request_id: str) -> list[dict[str, Any]]:
        return await calls_by_client_id(self.engine, client_request_id)

    async def ready(self) -> bool:
        return self._engine is not None and await ping(self._engine)

    @property
    def spooled(self) -> int:
        """Rows waiting in the spool for the database (down, or catching up)."""
        return self._spool.rows

    async def reload_prices(self) -> None:
        self._book = PriceBook(await store.load_prices(self.engine))

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None
        if self._writer is not None:
            await self._writer.aclose()
            self._writer = None
            self._spool.close()
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None

    async def _refresh(self) -> None:
        """Pick up price versions other replicas added through their admin API, and count
        the dead letters (an operator replays them from elsewhere)."""
        while True:
            await self.count_dead_letters()
            await asyncio.sleep(self._settings.ledger.price_refresh_interval)
            try:
                await self.reload_prices()
            except DB_ERRORS as exc:
                log.warning("ledger: price refresh failed, keeping the loaded prices: %s", exc)

    async def count_dead_letters(self) -> None:
        """Set the gauge of rows waiting in the dead-letter table (kept as it was if the
        database does not answer)."""
        try:
            waiting = await deadletters.count(self.engine)
        except DB_ERRORS as exc:
            log.warning("ledger: could not count the dead letters: %s", exc)
            return
        self._metrics.dead_letter_rows.set(waiting)

"""The ledger's Prometheus metrics, on the registry the app injects.

Each worker process has its own queue and spool file: with several workers a scrape adds
them up, and the lag is the worst worker's.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.ledger.models import SCALE


class LedgerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        """One declaration per ledger metric: a list, long only by its entries."""
        self.cost = Counter(
            "gateway_cost_usd",
            "Cost of finished calls in USD (the ledger holds the exact figures).",
            ["model", "team"],
            registry=registry,
        )
        self.queue_depth = Gauge(
            "gateway_ledger_queue_depth",
            "Ledger rows waiting in memory for the writer.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.spool_rows = Gauge(
            "gateway_ledger_spool_rows",
            "Ledger rows waiting in the local spool for the database to come back.",
            registry=registry,
            multiprocess_mode="livesum",
        )
        self.rows_written = Counter(
            "gateway_ledger_rows_written",
            "Ledger rows committed to the database.",
            registry=registry,
        )
        self.write_failures = Counter(
            "gateway_ledger_write_failures",
            "Batch writes the database refused or timed out (the rows went to the spool).",
            registry=registry,
        )
        self.dead_letters = Counter(
            "gateway_ledger_dead_letters",
            "Ledger rows the database refused for their content, set aside in the "
            "ledger_dead_letters table (every other row of their batch was written).",
            registry=registry,
        )
        self.dead_letter_rows = Gauge(
            "gateway_ledger_dead_letter_rows",
            "Rows waiting in the ledger_dead_letters table for an operator (the whole "
            "table, shared by every replica, as of the last check).",
            registry=registry,
            multiprocess_mode="livemax",
        )
        self._cost_by: dict[tuple[str, str], Any] = {}
        self.lag = Gauge(
            "gateway_ledger_lag_seconds",
            "Seconds from a call's end to its row's commit, for the last batch written.",
            registry=registry,
            multiprocess_mode="livemax",
        )

    def add_cost(self, model: str, team: str, units: int) -> None:
        """Count a call's cost (1e-10 USD units; the counter is in float USD, for graphs
        only); the labelled child is kept, as labels() is slow per call."""
        child = self._cost_by.get((model, team))
        if child is None:
            child = self._cost_by[model, team] = self.cost.labels(model, team)
        child.inc(units / 10**SCALE)

"""The usage ledger: exact cost of every call, written in batches to Postgres or SQLite."""

from gateway.ledger.service import Ledger

__all__ = ["Ledger"]

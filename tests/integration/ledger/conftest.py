from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from tests.integration.ledger.postgres import scratch_database


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty ledger database: a scratch Postgres database, or a SQLite file."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/ledger.db"
        return
    with scratch_database(request.getfixturevalue("pg_server_url")) as url:
        yield url


@pytest.fixture
def pg_db_url(pg_server_url: str) -> Iterator[str]:
    with scratch_database(pg_server_url) as url:
        yield url


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    """The ledger database, migrated (test modules that want it bare define their own)."""
    engine = make_engine(db_url)
    await upgrade(engine)
    yield engine
    await engine.dispose()

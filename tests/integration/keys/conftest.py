from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade
from tests.integration.ledger.postgres import scratch_database


@pytest.fixture(scope="module")
def pg_keys_url(pg_server_url: str) -> Iterator[str]:
    """A database of this module's own: other tests count the rows of the session's one."""
    with scratch_database(pg_server_url) as url:
        yield url


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The module's Postgres database (emptied after each test), or a fresh SQLite file."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keys.db"
    return str(request.getfixturevalue("pg_keys_url"))


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = make_engine(db_url)
    await upgrade(eng)
    yield eng
    async with eng.begin() as conn:
        for table in ("api_keys", "teams", "ledger"):
            await conn.exec_driver_sql(f"DELETE FROM {table}")
    await eng.dispose()

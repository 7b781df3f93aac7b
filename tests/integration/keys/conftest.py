from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from gateway.ledger.db import make_engine
from gateway.ledger.migrate import upgrade


@pytest.fixture(params=["postgresql", "sqlite"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The session's Postgres database (emptied after each test), or a fresh SQLite file."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/keys.db"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def engine(db_url: str) -> AsyncIterator[AsyncEngine]:
    eng = make_engine(db_url)
    await upgrade(eng)
    yield eng
    async with eng.begin() as conn:
        for table in ("api_keys", "teams", "ledger"):
            await conn.exec_driver_sql(f"DELETE FROM {table}")
    await eng.dispose()

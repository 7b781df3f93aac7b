"""Alembic environment: runs on the connection `gateway migrate` hands over.

gateway.ledger.migrate opens the (async) engine itself and passes a synchronous
connection in ``config.attributes["connection"]``; the plain ``alembic`` command works too
when ``sqlalchemy.url`` is given (``-x url=...`` or the ini file).
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from gateway.ledger.db import async_url
from gateway.tables import metadata

config = context.config


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


async def _migrate_url(url: str) -> None:
    engine = create_async_engine(async_url(url))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_migrate)
    finally:
        await engine.dispose()


connection = config.attributes.get("connection")
if connection is not None:
    _migrate(connection)
else:
    url = context.get_x_argument(as_dictionary=True).get("url") or config.get_main_option(
        "sqlalchemy.url"
    )
    if not url:
        raise SystemExit("give the database: alembic -x url=postgresql://... upgrade head")
    asyncio.run(_migrate_url(url))

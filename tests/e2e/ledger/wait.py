"""Reading the ledger from a test while the gateway's batched writer fills it."""

from __future__ import annotations

import asyncio
import time

import asyncpg


def rows_when(url: str, sql: str, *args: object, n: int) -> list[asyncpg.Record]:
    """The query's rows once there are n of them, or what there is after 10 s."""

    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(url)
        try:
            return await conn.fetch(sql, *args)
        finally:
            await conn.close()

    deadline = time.monotonic() + 10
    while True:
        found = asyncio.run(fetch())
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)

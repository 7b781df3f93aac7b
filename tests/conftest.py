"""Shared fixtures: real Postgres and Redis, each test run isolated from the others.

Postgres: every test session creates its own throwaway database on the server named by
GATEWAY_TEST_DATABASE_URL (default: the local `test` database's server) and drops it at
the end. Redis: every test gets its own key prefix, so parallel runs never collide and
nothing is flushed. A server that does not answer fails the tests that need it, loudly.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.integration.ledger.postgres import PrivatePostgres

PG_URL = os.environ.get("GATEWAY_TEST_DATABASE_URL", "postgresql://127.0.0.1:5432/test")
REDIS_URL = os.environ.get("GATEWAY_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def pg_server_url() -> str:
    """The admin URL of the Postgres server; fails (never skips) if it is down."""
    import asyncio

    import asyncpg

    async def probe() -> None:
        conn = await asyncpg.connect(PG_URL, timeout=5)
        await conn.close()

    try:
        asyncio.run(probe())
    except (OSError, asyncpg.PostgresError) as exc:
        pytest.fail(f"Postgres not reachable at {PG_URL} (set GATEWAY_TEST_DATABASE_URL): {exc}")
    return PG_URL


@pytest.fixture(scope="session")
def pg_url(pg_server_url: str) -> Iterator[str]:
    """A fresh, empty database for this test session: postgresql://.../gw_test_<hex>."""
    import asyncio

    import asyncpg

    name = f"gw_test_{uuid.uuid4().hex[:12]}"

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(pg_server_url, timeout=5)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    base, _, _ = pg_server_url.rpartition("/")
    yield f"{base}/{name}"
    asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def redis_server_url() -> str:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"Redis not reachable at {REDIS_URL} (set GATEWAY_TEST_REDIS_URL): {exc}")
    finally:
        client.close()
    return REDIS_URL


@pytest.fixture
async def redis_prefix(redis_server_url: str) -> AsyncIterator[str]:
    """A key prefix private to this test; its keys are deleted afterwards."""
    import redis.asyncio as aioredis

    prefix = f"gwtest:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = aioredis.Redis.from_url(redis_server_url)
    try:
        keys = [k async for k in client.scan_iter(match=f"{prefix}*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A Postgres server of this test's own, started; the test may stop and restart it."""
    from tests.integration.ledger.postgres import PrivatePostgres

    server = PrivatePostgres()
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()

"""A gateway cluster on loopback for fault experiments: stores, backends and the gateway
as real processes this suite owns, so it may kill, freeze and stop any of them.

The stores are private: a Postgres cluster (initdb + pg_ctl) and a redis-server on free
ports, never the machine's shared ones.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.conftest import MODEL, write_config
from tests.e2e.keys.conftest import ADMIN, PEPPER, issue_key
from tests.integration.index.redis_servers import RedisProcess
from tests.integration.ledger.postgres import PrivatePostgres, scratch_database
from tests.servers import Server, free_port, server_processes

BACKENDS = 3
START = 120.0
"""Seconds four processes starting at once may take to answer on a busy 2-core machine."""


@dataclass
class Stores:
    """The suite's own Postgres cluster and redis-server."""

    pg: PrivatePostgres
    redis: RedisProcess

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis.port}/0"


@dataclass
class Cluster:
    """One gateway (Postgres ledger, Redis limits and index, keys on) before three sims."""

    gateway: Server
    sims: list[Server]
    key: str
    """An API key's secret, issued through the admin API."""
    db_url: str

    @property
    def url(self) -> str:
        return self.gateway.url

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a gateway metric's samples whose labels include these."""
        return scrape(self.url, name, **labels)

    def access_lines(self) -> list[dict[str, Any]]:
        """The gateway's access log so far: one JSON object per finished call."""
        return access_lines(self.gateway.output())

    def ledger_rows(self) -> list[asyncpg.Record]:
        return ledger_rows(self.db_url)

    def rows_by_call(self, calls: set[str | None], deadline: float) -> Counter[str]:
        """Ledger rows per call id (0 for a call without one), once every call has a row
        (a spool replays after an outage) or the deadline passed."""
        while True:
            rows = Counter(r["request_id"] for r in self.ledger_rows())
            found = Counter({c: rows[c] for c in calls if c is not None})
            if all(found.values()) or time.monotonic() > deadline:
                return found
            time.sleep(0.5)


def scrape(url: str, name: str, **labels: str) -> float:
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def access_lines(output: str) -> list[dict[str, Any]]:
    lines = []
    for line in output.splitlines():
        if line.startswith("{") and '"request_id"' in line:
            lines.append(json.loads(line))
    return lines


def ledger_rows(db_url: str) -> list[asyncpg.Record]:
    import asyncio

    async def fetch() -> list[asyncpg.Record]:
        conn = await asyncpg.connect(db_url, timeout=10)
        try:
            return await conn.fetch("SELECT * FROM ledger")
        finally:
            await conn.close()

    return asyncio.run(fetch())


@contextlib.contextmanager
def private_stores() -> Iterator[Stores]:
    pg = PrivatePostgres()
    redis = RedisProcess()
    try:
        pg.init()
        pg.start()
        redis.start()
        yield Stores(pg, redis)
    finally:
        redis.kill()
        pg.remove()


def gateway_sections(stores: Stores, db_url: str, **sections: Any) -> dict[str, Any]:
    """Config sections for a gateway on the private stores; `sections` override them."""
    base: dict[str, Any] = {
        "database": {"url": db_url, "auto_migrate": True},
        "redis": {"url": stores.redis_url, "key_prefix": f"gwfault:{uuid.uuid4().hex[:8]}:"},
        "auth": {"admin_key": ADMIN, "pepper": PEPPER},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return base


@contextlib.contextmanager
def start_cluster(
    stores: Stores, workdir: Path, *sim_args: str, rpm: int = 1_000_000, **sections: Any
) -> Iterator[Cluster]:
    """Three `gateway sim` processes and a `gateway serve` in front of them, and a key."""
    with ExitStack() as stack:
        db_url = stack.enter_context(scratch_database(stores.pg.url))
        ports = [free_port() for _ in range(BACKENDS + 1)]
        config = write_config(
            workdir / "gateway.yaml",
            [f"http://127.0.0.1:{port}" for port in ports[1:]],
            **gateway_sections(stores, db_url, **sections),
        )
        sims = [["sim", "--model", MODEL, *sim_args, "--port", str(p)] for p in ports[1:]]
        gateway, *backends = stack.enter_context(
            server_processes(
                ["serve", "--config", str(config), "--port", str(ports[0])], *sims, timeout=START
            )
        )
        _, key = issue_key(gateway.url, "faults", rpm=rpm)
        yield Cluster(gateway=gateway, sims=backends, key=key, db_url=db_url)

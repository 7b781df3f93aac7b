"""Postgres for the ledger tests: a scratch database per test, and a private server.

The private server (initdb into a temp dir, a free port, its socket in that dir) is the
one a fault test may stop and start: the machine's shared cluster is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import asyncpg

from tests.conftest import free_port

PG_BIN = Path(os.environ.get("GATEWAY_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


async def _admin(server_url: str, sql: str) -> None:
    conn = await asyncpg.connect(server_url, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@contextlib.contextmanager
def scratch_database(server_url: str) -> Iterator[str]:
    """A new empty database on the server, dropped afterwards (also if the test fails)."""
    name = f"gw_ledger_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(server_url, f'CREATE DATABASE "{name}"'))
    base, _, _ = server_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        asyncio.run(_admin(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class PrivatePostgres:
    """A throwaway Postgres server owned by one test: start, stop (even -m immediate)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="gw-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        # initdb refuses to run as root: hand the directory to the postgres user.
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self._as:
            shutil.chown(self.dir, "postgres")

    def _run(self, *args: str) -> None:
        cmd = [*self._as, *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}")

    def init(self) -> None:
        self._run(str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "--no-sync", "-E", "UTF8")  # fmt: skip

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                "-c fsync=off -c full_page_writes=off")  # fmt: skip
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts,
                  "-l", str(self.dir / "log"), "-w", "-t", "30", "start")  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

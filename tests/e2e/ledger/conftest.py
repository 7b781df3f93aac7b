from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.e2e.conftest import write_config
from tests.integration.ledger.postgres import scratch_database
from tests.servers import gateway_process

ADMIN = "test-admin-key"


@pytest.fixture(scope="module")
def ledger_db(pg_server_url: str) -> Iterator[str]:
    """A Postgres database of the module's own for its gateway's ledger."""
    with scratch_database(pg_server_url) as url:
        yield url


@contextlib.contextmanager
def ledger_gateway(sim: str, db_url: str, workdir: Path, **sections: Any) -> Iterator[str]:
    """A gateway (auth off) in front of one simulator, its ledger in ``db_url``."""
    cfg = write_config(
        workdir / "g.yaml", [sim], database={"url": db_url, "auto_migrate": True},
        auth={"enabled": False, "admin_key": ADMIN}, **sections,
    )  # fmt: skip
    with gateway_process("serve", "--config", str(cfg)) as url:
        yield url


@pytest.fixture(scope="module")
def client(gateway: str) -> Iterator[openai.OpenAI]:
    """The official client on the module's `gateway` (its base URL)."""
    with openai.OpenAI(base_url=gateway + "/v1", api_key="x", max_retries=0) as c:
        yield c

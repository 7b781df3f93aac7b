"""The whole app in process: create_app, its lifespan and Services, the embedded simulator
and a SQLite ledger, driven through httpx's ASGI transport (whole bodies, no streams)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.services import Services
from gateway.settings import load_settings


@dataclass
class InProcess:
    client: httpx.AsyncClient
    services: Services
    ledger_db: Path


@pytest.fixture
async def in_process(tmp_path: Path) -> AsyncIterator[InProcess]:
    settings = load_settings(
        database={"url": f"sqlite:///{tmp_path}/ledger.db"},
        ledger={"spool_dir": str(tmp_path / "spool")},
    )
    app = create_app(settings)
    # Starlette raises a route's exception again once it has answered (for the server's
    # log); the transport must not hand it to the test as the response.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with (
        app.app.router.lifespan_context(app.app),
        httpx.AsyncClient(transport=transport, base_url="http://gw") as client,
    ):
        yield InProcess(client, app.app.state.services, tmp_path / "ledger.db")

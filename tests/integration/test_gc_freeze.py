"""The app's lifespan hides the objects alive at startup from the garbage collector
(server.gc_freeze): full collections would otherwise walk them all under load."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest

from gateway.app import create_app
from gateway.settings import load_settings


async def started_freeze_count(tmp_path: Path, freeze: bool) -> int:
    """Start the embedded gateway in process, read the freeze count, shut it down."""
    settings = load_settings(
        server={"gc_freeze": freeze},
        database={"url": f"sqlite:///{tmp_path}/ledger.db"},
        ledger={"spool_dir": str(tmp_path / "spool")},
    )
    app = create_app(settings)
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}},
                                   inbox.get, outbox.put))  # fmt: skip
    await inbox.put({"type": "lifespan.startup"})
    assert (await asyncio.wait_for(outbox.get(), 30))["type"] == "lifespan.startup.complete"
    frozen = gc.get_freeze_count()
    await inbox.put({"type": "lifespan.shutdown"})
    assert (await asyncio.wait_for(outbox.get(), 30))["type"] == "lifespan.shutdown.complete"
    await task
    return frozen


@pytest.mark.parametrize("freeze", [True, False])
async def test_startup_objects_are_frozen_only_when_asked(tmp_path: Path, freeze: bool) -> None:
    gc.unfreeze()
    try:
        frozen = await started_freeze_count(tmp_path, freeze)
    finally:
        gc.unfreeze()  # the rest of the test session collects as usual
    assert (frozen > 10_000) is freeze

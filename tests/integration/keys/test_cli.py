"""`gateway keys` against real databases: the printed secret authenticates, disable works."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from gateway.cli import main
from gateway.errors import Unauthorized
from gateway.keys import KeyRing
from gateway.ledger.db import make_engine
from gateway.settings import AuthSettings


def keys(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(["keys", *argv])
    out = capsys.readouterr()
    return code, json.loads(out.out) if code == 0 else None, out.err


def authenticate(url: str, secret: str) -> str | None:
    async def check() -> str | None:
        engine = make_engine(url)
        try:
            ring = KeyRing(AuthSettings(pepper="cli-pepper"), engine, CollectorRegistry(),
                           enabled=True)  # fmt: skip
            return (await ring.authenticate(f"Bearer {secret}")).key_id
        finally:
            await engine.dispose()

    return asyncio.run(check())


def test_issue_list_and_disable(db_url: str, tmp_path: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    cfg = tmp_path / "g.yaml"
    cfg.write_text(yaml.safe_dump({"auth": {"pepper": "cli-pepper"},
                                   "database": {"url": db_url, "auto_migrate": True}}))  # fmt: skip
    common = ("--config", str(cfg))
    code, team, _ = keys(capsys, "teams", "create", "search", "--rpm", "600", "--budget", "50",
                         "--budget-period", "day", *common)  # fmt: skip
    assert code == 0
    assert team == {**team, "name": "search", "rpm": 600, "budget_usd": "50",
                    "budget_period": "day"}  # fmt: skip
    assert keys(capsys, "teams", "create", "search", *common)[0] == 1
    code, _, err = keys(capsys, "create", "--team", "ghost", *common)
    assert code == 1
    assert "teams create ghost" in err

    code, created, err = keys(capsys, "create", "--team", "search", "--models", "a", "b",
                              "--tpm", "1000", "--expires", "2030-01-01", *common)  # fmt: skip
    assert code == 0
    assert "cannot be shown again" in err
    assert isinstance(created, dict)
    secret, key_id = created["key"], created["id"]
    assert created["models"] == ["a", "b"]
    assert created["expires_at"].startswith("2030-01-01T00:00:00")
    assert authenticate(db_url, secret) == key_id

    code, listed, _ = keys(capsys, "list", "--team", "search", *common)
    assert isinstance(listed, list)
    assert [k["id"] for k in listed] == [key_id]
    assert secret not in json.dumps(listed)

    assert keys(capsys, "disable", key_id, *common)[0] == 0
    with pytest.raises(Unauthorized, match="disabled"):
        authenticate(db_url, secret)
    assert keys(capsys, "disable", "key_missing", *common)[0] == 1

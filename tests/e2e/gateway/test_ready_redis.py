"""/ready while the shared Redis is gone: the index is degraded, the gateway still serves."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import MODEL, write_config
from tests.integration.index.redis_servers import RedisProcess
from tests.servers import gateway_process

BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "a prompt " * 20}],
    "max_tokens": 2,
}


@pytest.fixture
def redis_server() -> Iterator[RedisProcess]:
    server = RedisProcess()
    server.start()
    try:
        yield server
    finally:
        server.kill()


def test_a_redis_outage_is_reported_degraded_not_unready(
    sims: list[str], redis_server: RedisProcess, tmp_path: Path
) -> None:
    redis = {"url": f"redis://127.0.0.1:{redis_server.port}/0", "probe_interval": 0.2}
    cfg = write_config(tmp_path / "g.yaml", sims, redis=redis)
    with gateway_process("serve", "--config", str(cfg)) as url:
        assert httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30).status_code == 200
        ready = httpx.get(url + "/ready", timeout=10).json()
        assert (ready["status"], ready["index"]) == ("ready", {"status": "ok", "store": "redis"})

        redis_server.kill()
        deadline = time.monotonic() + 20
        while True:  # the index notices on the calls' lookups; the calls are all served
            assert (
                httpx.post(url + "/v1/chat/completions", json=BODY, timeout=30).status_code == 200
            )
            resp = httpx.get(url + "/ready", timeout=10)
            if resp.json()["index"]["status"] == "degraded" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert resp.status_code == 200
        assert resp.json()["status"] == "degraded"
        assert "index" in resp.json()["degraded"]

        redis_server.start()  # the same port: the index's probe finds it again
        deadline = time.monotonic() + 20
        while httpx.get(url + "/ready", timeout=10).json()["index"]["status"] != "ok":
            assert time.monotonic() < deadline
            time.sleep(0.1)

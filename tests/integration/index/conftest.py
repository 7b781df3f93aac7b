"""Fixtures: a throwaway Redis server, and a throwaway three-node Redis Cluster."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from tests.conftest import free_port
from tests.integration.index.redis_servers import RedisProcess, cluster_ready


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.kill()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[RedisProcess]]:
    """A three-primary Redis Cluster, every slot assigned, state ok."""
    nodes = [
        RedisProcess("--cluster-enabled", "yes", "--cluster-port", str(free_port()),
                     "--cluster-config-file", str(tmp_path / f"nodes-{i}.conf"))
        for i in range(3)
    ]  # fmt: skip
    try:
        for node in nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        for node in nodes:  # each node must see the whole cluster, not just the first
            client = redis.Redis(port=node.port)
            try:
                while not cluster_ready(client, len(nodes)):
                    assert time.monotonic() < deadline, "cluster did not reach state ok"
                    time.sleep(0.05)
            finally:
                client.close()
        yield nodes
    finally:
        for node in nodes:
            node.kill()

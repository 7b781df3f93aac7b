"""Throwaway redis-server processes on free loopback ports: to kill, freeze, cluster."""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import free_port


class RedisProcess:
    """One redis-server without persistence; start, kill, freeze and thaw it at will."""

    def __init__(self, *extra: str) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not on PATH")
        self.port = free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="gw-redis-")
        self._cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--daemonize", "no",
                     "--dir", self._dir.name, *extra]  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(self._cmd, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=0.2)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        finally:
            client.close()

    def pause(self, paused: bool) -> None:
        """Freeze the server (SIGSTOP), so that calls hang until it resumes (SIGCONT)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        self.kill()
        self._dir.cleanup()


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.close()


@pytest.fixture
def cluster() -> Iterator[list[RedisProcess]]:
    """A three-primary Redis Cluster, every slot assigned, state ok."""
    nodes = [RedisProcess("--cluster-enabled", "yes", "--cluster-port", str(free_port()))
             for _ in range(3)]  # fmt: skip
    try:
        for node in nodes:
            node.start()
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        client = redis.Redis(port=nodes[0].port)
        deadline = time.monotonic() + 10
        while client.cluster("INFO").get("cluster_state") != "ok":
            assert time.monotonic() < deadline, "cluster did not reach state ok"
            time.sleep(0.05)
        client.close()
        yield nodes
    finally:
        for node in nodes:
            node.close()

"""Throwaway redis-server processes on free loopback ports: to kill, freeze, cluster."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import pytest
import redis

from tests.conftest import free_port


class RedisProcess:
    """One redis-server without persistence; start, kill, freeze and thaw it at will."""

    def __init__(self, *extra: str) -> None:
        """extra: more redis-server options; nothing is written to disk without them."""
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not on PATH")
        self.port = free_port()
        self._cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--daemonize", "no", *extra]  # fmt: skip
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

    def stop(self) -> None:
        """Shut down as an operator's stop does: saving first, when started with a
        ``--dir`` to save to, so that a start on the same port loads what it held."""
        assert self._proc is not None
        client = redis.Redis(port=self.port, socket_timeout=10)
        try:
            client.shutdown(save=True)
        except redis.ConnectionError:
            pass  # the server closes the connection as it goes
        finally:
            client.close()
        self._proc.wait(timeout=30)
        self._proc = None

    def pause(self, paused: bool) -> None:
        """Freeze the server (SIGSTOP), so that calls hang until it resumes (SIGCONT)."""
        assert self._proc is not None
        self._proc.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)

    def kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None


def cluster_ready(client: redis.Redis, size: int) -> bool:
    info = client.cluster("INFO")
    return bool(
        info.get("cluster_state") == "ok" and int(info.get("cluster_known_nodes", 0)) == size
    )

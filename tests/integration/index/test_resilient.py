"""Redis going away and coming back: routing keeps working throughout and recovers."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from gateway.index import open_index
from gateway.index.base import PrefixIndex
from gateway.settings import Settings
from tests.conftest import free_port

A = list(range(1, 9))
B = list(range(11, 19))


class RedisProcess:
    """A throwaway redis-server on a free loopback port, to kill and restart at will."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not on PATH")
        self.port = free_port()
        self._cmd = [binary, "--port", str(self.port), "--bind", "127.0.0.1",
                     "--save", "", "--appendonly", "no", "--daemonize", "no"]  # fmt: skip
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(self._cmd, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
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


@pytest.fixture
def server() -> Iterator[RedisProcess]:
    proc = RedisProcess()
    proc.start()
    yield proc
    proc.kill()


def settings(port: int) -> Settings:
    return Settings(
        redis={"url": f"redis://127.0.0.1:{port}/0", "timeout": 0.1, "probe_interval": 0.1},
    )  # type: ignore[arg-type]


async def eventually(check: Callable[[], bool]) -> None:
    """Poll check for up to 5 s: the breaker changes state on its own probe schedule."""
    for _ in range(100):
        if check():
            return
        await asyncio.sleep(0.05)
    pytest.fail("condition not reached within 5 s")


async def test_unreachable_redis_degrades_to_the_local_index() -> None:
    index = open_index(settings(free_port()))
    await index.start()
    try:
        began = time.monotonic()
        index.record("m", "b0", A)
        assert await index.lookup("m", A) == {"b0": 8}
        assert not index.healthy
        assert await index.lookup("m", B) == {}
        index.forget("m", "b0", A, keep_blocks=2)
        assert await index.lookup("m", A) == {"b0": 2}
        assert await index.size() == 2
        assert time.monotonic() - began < 2.0
    finally:
        await index.aclose()


async def test_index_survives_a_redis_restart(server: RedisProcess) -> None:
    index: PrefixIndex = open_index(settings(server.port))
    await index.start()
    try:
        index.record("m", "b0", A)
        await index.flush()
        assert await index.lookup("m", A) == {"b0": 8}
        assert index.healthy

        server.kill()
        # The local understudy answers with what this replica recorded; nothing raises.
        assert await index.lookup("m", A) == {"b0": 8}
        assert not index.healthy
        index.record("m", "b1", B)
        assert await index.lookup("m", B) == {"b1": 8}

        server.start()
        await eventually(lambda: index.healthy)
        # The restarted Redis is empty (no persistence): it learns again from new records.
        index.record("m", "b2", B)
        await index.flush()
        assert await index.lookup("m", B) == {"b2": 8}
        assert await index.size() == 8
    finally:
        await index.aclose()


async def test_a_failing_flush_opens_the_breaker(server: RedisProcess) -> None:
    index = open_index(settings(server.port))
    await index.start()
    try:
        assert await index.lookup("m", A) == {}
        server.kill()
        index.record("m", "b0", A)
        await index.flush()
        await eventually(lambda: not index.healthy)
        assert await index.lookup("m", A) == {"b0": 8}
    finally:
        await index.aclose()


async def test_only_repeated_timeouts_open_the_breaker(server: RedisProcess) -> None:
    index = open_index(settings(server.port))
    await index.start()
    try:
        index.record("m", "b0", A)
        await index.flush()
        server.pause(True)
        try:
            for _ in range(2):
                assert await index.lookup("m", A) == {"b0": 8}
                assert index.healthy
            assert await index.lookup("m", A) == {"b0": 8}
            assert not index.healthy
        finally:
            server.pause(False)
        await eventually(lambda: index.healthy)
        assert await index.lookup("m", B) == {}
    finally:
        await index.aclose()

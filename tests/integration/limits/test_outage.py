"""Redis going away never blocks traffic: limits fail open, count it, and come back."""

from __future__ import annotations

import asyncio
import contextlib
import math
import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import redis

from gateway.limits.base import Bucket, Counter, Plan, Seed
from tests.conftest import free_port
from tests.integration.limits.conftest import redis_limiter


@contextlib.contextmanager
def private_redis(port: int) -> Iterator[None]:
    """A throwaway redis-server of this test's own on ``port`` (the shared one is never touched)."""
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port, socket_timeout=1)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError):
                if client.ping():
                    break
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)
        client.close()
        yield
    finally:
        proc.terminate()
        proc.wait(10)


async def test_limits_fail_open_while_redis_is_down_and_recover() -> None:
    from prometheus_client import CollectorRegistry

    port = free_port()
    registry = CollectorRegistry()
    limiter = redis_limiter(f"redis://127.0.0.1:{port}/0", "gwtest:outage:", registry,
                            probe_interval=0.2)  # fmt: skip
    await limiter.start()
    rpm = Plan("t", (Bucket("key", "requests", "k", 1),), (), ())
    try:
        for _ in range(3):  # nothing listens: every call passes, no call waits on Redis
            started = time.monotonic()
            assert (await limiter.admit(rpm, 0)).allowed
            assert time.monotonic() - started < 0.5
        assert registry.get_sample_value("gateway_limits_errors_total") == 1  # then skipped
        await limiter.seed([Seed(Counter("key", "k", "d1"), "t", 5, datetime.now(UTC))])
        assert registry.get_sample_value("gateway_limits_degraded") == 1
        with private_redis(port):
            await asyncio.sleep(0.25)  # past probe_interval: the next call tries Redis again
            assert (await limiter.admit(rpm, 0)).allowed
            assert registry.get_sample_value("gateway_limits_degraded") == 0
            assert not (await limiter.admit(rpm, 0)).allowed  # enforced again
    finally:
        await limiter.aclose()


async def test_a_replica_holding_leases_fails_open_when_redis_goes_and_recovers() -> None:
    from prometheus_client import CollectorRegistry

    port = free_port()
    registry = CollectorRegistry()
    limiter = redis_limiter(f"redis://127.0.0.1:{port}/0", "gwtest:outage-lease:", registry,
                            probe_interval=0.2, lease_period=0.2)  # fmt: skip
    await limiter.start()
    rpm = Plan("t", (Bucket("key", "requests", "k", 600),), (), ())  # leases of 10
    try:
        with private_redis(port):
            assert (await limiter.admit(rpm, 0)).allowed
        await asyncio.sleep(0.3)  # the lease aged out; giving it back found no Redis
        for _ in range(20):  # past anything it held: every call passes
            assert (await limiter.admit(rpm, 0)).allowed
        assert registry.get_sample_value("gateway_limits_degraded") == 1
        with private_redis(port):  # a fresh, empty Redis: a full bucket again
            await asyncio.sleep(0.25)
            served, started = 0, time.monotonic()
            while (await limiter.admit(rpm, 0)).allowed and served <= 700:
                served += 1
            assert registry.get_sample_value("gateway_limits_degraded") == 0
            refilled = math.ceil((time.monotonic() - started) * 10) + 1  # 600/min: 10/s
            assert 600 <= served <= 600 + refilled  # enforced again, with leases
    finally:
        await limiter.aclose()

"""`gateway bench limits`, shortened: two real replicas sharing the machine's Redis hold one
key's rate limit under load (the README's five-run figures come from the full command)."""

from __future__ import annotations

from gateway.bench.limits import Load, Run, bench


def test_the_allowed_count_is_the_gcra_bound() -> None:
    # A fresh key of 60 a minute: its minute at once, then one call a second.
    assert Run(0, 0, 0, window=8.99, rpm=60).allowed == 68
    assert Run(0, 0, 0, window=9.0, rpm=60).allowed == 69
    assert Run(0, 0, 0, window=20.0, rpm=30).allowed == 40


def test_two_replicas_under_load_serve_no_more_than_the_limit_allows(
    redis_server_url: str, pg_server_url: str
) -> None:
    load = Load(replicas=2, clients=8, seconds=8, rpm=60, runs=1)
    [run] = bench(load, redis_server_url, pg_server_url)
    assert run.other == 0
    assert run.refused > 0  # the load went past the limit, so the limit was what held it
    assert run.served >= 60  # the key's minute was served, not lost to a failing limiter
    assert run.served <= run.allowed

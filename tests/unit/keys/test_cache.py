import asyncio
import functools
import logging

import pytest

from gateway.keys.cache import LookupCache
from tests.clock import Clock, key_renewals


class Source:
    """Counts loads; answers from a dict, or fails while ``down``; a load hangs while
    ``go`` is clear (shows who waits for a load and who does not)."""

    def __init__(self, data: dict[str, str]) -> None:
        self.data = data
        self.loads = 0
        self.down = False
        self.go = asyncio.Event()
        self.go.set()

    async def load(self, key: str) -> str | None:
        self.loads += 1
        await asyncio.sleep(0.01)
        await self.go.wait()
        if self.down:
            raise OSError("database down")
        return self.data.get(key)


async def test_found_and_not_found_are_both_kept_for_the_ttl() -> None:
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, clock=clock)
    for _ in range(3):
        assert await cache.get("a", lambda: src.load("a")) == "A"
        assert await cache.get("zz", lambda: src.load("zz")) is None
    assert src.loads == 2
    clock.now = 5.1
    src.data["a"] = "A2"
    assert await cache.get("a", lambda: src.load("a")) == "A2"
    assert src.loads == 3


async def test_fresh_answers_a_hit_without_loading_and_nothing_once_aged() -> None:
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, clock=clock)
    assert cache.fresh("a") is None
    await cache.get("a", lambda: src.load("a"))
    hit = cache.fresh("a")
    assert hit is not None
    assert hit.value == "A"
    clock.now = 5.1
    assert cache.fresh("a") is None
    assert src.loads == 1


async def test_concurrent_misses_share_one_load() -> None:
    src = Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10)
    got = await asyncio.gather(*(cache.get("a", lambda: src.load("a")) for _ in range(20)))
    assert got == ["A"] * 20
    assert src.loads == 1


async def test_size_is_bounded_longest_loaded_first() -> None:
    src = Source({})
    cache: LookupCache[str] = LookupCache(60.0, 3)
    for k in "abcd":
        await cache.get(k, functools.partial(src.load, k))
    assert len(cache) == 3
    await cache.get("a", lambda: src.load("a"))
    assert src.loads == 5  # "a" was forgotten, loaded again; now c, d, a
    await cache.get("c", lambda: src.load("c"))
    assert src.loads == 5  # a hit...
    await cache.get("e", lambda: src.load("e"))
    await cache.get("d", lambda: src.load("d"))
    assert src.loads == 6  # ...does not reorder: "e" pushed out "c", loaded first
    await cache.get("c", lambda: src.load("c"))
    assert src.loads == 7


async def test_a_failing_source_serves_the_expired_answer_or_raises() -> None:
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, stale_on=(OSError,), stale_for=60, clock=clock)
    await cache.get("a", lambda: src.load("a"))
    clock.now, src.down = 10.0, True
    assert await cache.get("a", lambda: src.load("a")) == "A"
    with pytest.raises(OSError, match="database down"):
        await cache.get("b", lambda: src.load("b"))


async def test_an_answer_is_served_stale_only_up_to_stale_for_after_the_source_gave_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, stale_on=(OSError,), stale_for=60, clock=clock)
    await cache.get("a", lambda: src.load("a"))
    src.down = True
    for now in (6.0, 20.0, 40.0, 59.0):  # each failed load serves it for another ttl...
        clock.now = now
        assert await cache.get("a", lambda: src.load("a")) == "A"
        assert cache.stale() == (1, now)  # ...but its age counts from the source's answer
    assert caplog.text.count("key lookups fail (OSError: database down)") == 1
    clock.now = 64.5  # served at 59 for a ttl: now older than stale_for, and due again
    with pytest.raises(OSError, match="database down"):
        await cache.get("a", lambda: src.load("a"))
    src.down = False
    assert await cache.get("a", lambda: src.load("a")) == "A"
    assert cache.stale() == (0, 0.0)
    assert "key lookups answer again" in caplog.text


async def test_a_not_found_answer_is_never_served_stale() -> None:
    clock, src = Clock(), Source({})
    cache: LookupCache[str] = LookupCache(5.0, 10, stale_on=(OSError,), stale_for=60, clock=clock)
    assert await cache.get("x", lambda: src.load("x")) is None
    clock.now, src.down = 6.0, True
    with pytest.raises(OSError, match="database down"):  # nobody could check it: not "not found"
        await cache.get("x", lambda: src.load("x"))


async def test_stale_counts_the_answers_served_stale_until_they_are_too_old() -> None:
    clock, src = Clock(), Source({"a": "A", "b": "B"})
    cache: LookupCache[str] = LookupCache(5.0, 10, stale_on=(OSError,), stale_for=60, clock=clock)
    await cache.get("a", lambda: src.load("a"))
    clock.now = 20.0
    await cache.get("b", lambda: src.load("b"))
    clock.now, src.down = 30.0, True
    await cache.get("a", lambda: src.load("a"))
    await cache.get("b", lambda: src.load("b"))
    assert cache.stale() == (2, 30.0)
    clock.now = 70.0  # "a" (confirmed at 0) is past stale_for: it is served no more
    assert cache.stale() == (1, 50.0)
    cache.clear()
    assert cache.stale() == (0, 0.0)


async def test_clear_forgets_everything() -> None:
    src = Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(60.0, 10)
    await cache.get("a", lambda: src.load("a"))
    cache.clear()
    await cache.get("a", lambda: src.load("a"))
    assert src.loads == 2


async def test_a_waiter_loads_itself_when_the_loading_caller_goes_away() -> None:
    src = Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(60.0, 10)
    first = asyncio.create_task(cache.get("a", lambda: src.load("a")))
    await asyncio.sleep(0)  # first is now loading
    second = asyncio.create_task(cache.get("a", lambda: src.load("a")))
    await asyncio.sleep(0)
    first.cancel()
    assert await second == "A"
    assert src.loads == 2
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_an_answer_due_for_renewal_is_renewed_in_the_background_and_nobody_waits() -> None:
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, clock=clock)
    assert await cache.get("a", lambda: src.load("a")) == "A"
    src.go.clear()
    src.data["a"] = "A2"
    clock.now = 4.5  # past 80% of the ttl: due, still valid
    assert cache.fresh("a") is None  # the hot path hands it to get()...
    for _ in range(5):  # ...which answers at once, though the load hangs
        assert await asyncio.wait_for(cache.get("a", lambda: src.load("a")), 1) == "A"
    assert src.loads == 2  # one renewal for all of them
    src.go.set()
    await key_renewals()
    hit = cache.fresh("a")
    assert hit is not None
    assert hit.value == "A2"
    assert hit.until == 4.5 + 5.0


async def test_a_failed_renewal_keeps_the_answer_until_it_expires(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="gateway.keys.cache")
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, clock=clock)
    await cache.get("a", lambda: src.load("a"))
    clock.now, src.down = 4.5, True
    assert await cache.get("a", lambda: src.load("a")) == "A"
    await key_renewals()  # it fails (logged; the answer stays)
    assert src.loads == 2
    assert "key lookup renewal failed: OSError" in caplog.text
    assert await cache.get("a", lambda: src.load("a")) == "A"  # no second renewal
    assert src.loads == 2
    clock.now, src.down = 5.1, False
    assert await cache.get("a", lambda: src.load("a")) == "A"  # expired: loaded, waited for
    assert src.loads == 3


async def test_close_stops_a_renewal_on_its_way() -> None:
    clock, src = Clock(), Source({"a": "A"})
    cache: LookupCache[str] = LookupCache(5.0, 10, clock=clock)
    await cache.get("a", lambda: src.load("a"))
    src.go.clear()
    clock.now = 4.5
    assert await cache.get("a", lambda: src.load("a")) == "A"
    await asyncio.sleep(0)  # the renewal now hangs in the load
    assert src.loads == 2
    src.data["a"] = "A2"
    await asyncio.wait_for(cache.aclose(), 1)
    src.go.set()
    await asyncio.sleep(0.01)
    hit = cache.fresh("a")  # the old answer, to the end of its life: never renewed
    assert hit is not None
    assert (hit.value, hit.until) == ("A", 5.0)

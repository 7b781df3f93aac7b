"""A wait for a condition that something the test cannot await makes true (a probe on its
own schedule, a background writer, a connection's callback): polled, with a deadline."""

import asyncio
import time
from collections.abc import Callable


async def eventually(check: Callable[[], object], within: float = 5.0, every: float = 0.02) -> None:
    """Until ``check()`` is true; fails the test if it is not within ``within`` seconds."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"the condition never came true within {within} s"
        await asyncio.sleep(every)

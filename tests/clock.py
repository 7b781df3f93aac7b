"""A clock a test moves by hand, for code that takes its clock as a parameter, and a wait
for the background work that moving it set off (the clock stands still meanwhile)."""

import asyncio


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def key_renewals() -> None:
    """Wait for the key cache's background renewals in flight (30 s at most)."""
    renewals = [t for t in asyncio.all_tasks() if t.get_name() == "key-cache-renewal"]
    assert renewals, "no renewal started"
    await asyncio.wait_for(asyncio.gather(*renewals, return_exceptions=True), 30)

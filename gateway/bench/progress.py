"""A one-line progress bar on stderr, redrawn at most ten times a second.

Hand-rolled rather than tqdm: it is a dozen lines, and redrawing is throttled so the
bar costs nothing measurable next to the requests it counts.
"""

from __future__ import annotations

import time
from typing import TextIO

WIDTH = 30
INTERVAL = 0.1


class Progress:
    """Counts finished requests against a request total or a time budget."""

    def __init__(self, stream: TextIO, *, total: int | None, duration: float | None) -> None:
        self._stream = stream
        self._total = total
        self._duration = duration
        self._started = time.perf_counter()
        self._drawn = 0.0
        self.done = 0
        self.failed = 0

    def advance(self, *, failed: bool) -> None:
        self.done += 1
        self.failed += failed
        now = time.perf_counter()
        if now - self._drawn >= INTERVAL:
            self._drawn = now
            self._draw(now)

    def close(self) -> None:
        self._draw(time.perf_counter())
        self._stream.write("\n")
        self._stream.flush()

    def _draw(self, now: float) -> None:
        elapsed = now - self._started
        fraction = self._fraction(elapsed)
        bar = "#" * int(fraction * WIDTH)
        count = f"{self.done}/{self._total}" if self._total else str(self.done)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        figures = f"{count} req  {rate:.1f} req/s  {self.failed} failed  {elapsed:.1f} s"
        self._stream.write(f"\r[{bar:<{WIDTH}}] {figures}")
        self._stream.flush()

    def _fraction(self, elapsed: float) -> float:
        by_count = self.done / self._total if self._total else 0.0
        by_time = elapsed / self._duration if self._duration else 0.0
        return min(1.0, max(by_count, by_time))

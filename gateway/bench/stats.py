"""Percentiles and means over latency samples.

Percentiles interpolate linearly between closest ranks (numpy's default "linear"
method), so p50 of an even count is the midpoint and figures match what an analyst gets
from numpy or pandas on the same JSON.
"""

from __future__ import annotations

from collections.abc import Sequence


def percentiles(values: Sequence[float], ps: Sequence[float]) -> list[float | None]:
    """The ps-th percentiles (each 0..100) of values, sorting once; None when empty."""
    ordered = sorted(values)
    return [_ranked(ordered, p) for p in ps]


def _ranked(ordered: Sequence[float], p: float) -> float | None:
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, got {p}")
    if not ordered:
        return None
    rank = (len(ordered) - 1) * p / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def ratio(part: int, whole: int) -> float | None:
    return part / whole if whole else None

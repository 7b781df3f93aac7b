"""Percentiles match numpy's default (linear) method on known data."""

from __future__ import annotations

import pytest

from gateway.bench.stats import mean, percentiles, ratio


def test_percentiles_of_one_to_hundred_and_one() -> None:
    values = [float(v) for v in range(101, 0, -1)]  # unsorted on purpose
    assert percentiles(values, (0, 50, 90, 99, 100)) == [1.0, 51.0, 91.0, 100.0, 101.0]


def test_percentiles_interpolate_between_ranks() -> None:
    # numpy.percentile([1, 2, 3, 4], [50, 90, 99]) == [2.5, 3.7, 3.97]
    got = percentiles([4.0, 1.0, 3.0, 2.0], (50, 90, 99))
    assert got == pytest.approx([2.5, 3.7, 3.97])


def test_single_value_and_empty() -> None:
    assert percentiles([7.0], (50, 99)) == [7.0, 7.0]
    assert percentiles([], (50,)) == [None]
    assert mean([]) is None
    assert ratio(3, 0) is None


def test_mean_and_ratio() -> None:
    assert mean([1.0, 2.0, 6.0]) == 3.0
    assert ratio(1, 4) == 0.25


def test_out_of_range_percentile_is_refused() -> None:
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentiles([1.0], (101,))

"""``yieldgate._stats.percentile``: the one nearest-rank percentile."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from yieldgate._stats import percentile


def test_an_empty_sample_gives_the_default_or_raises() -> None:
    assert percentile([], 50, default=None) is None
    assert math.isnan(percentile([], 99, default=math.nan))
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match="empty"):
        percentile(iter(()), 50)


@pytest.mark.parametrize("p", [0, 1, 50, 99, 99.9, 100])
def test_one_value_is_every_percentile(p: float) -> None:
    assert percentile([7.5], p) == 7.5


def test_one_to_a_hundred() -> None:
    values = list(range(100, 0, -1))  # unsorted on purpose
    assert [percentile(values, p) for p in (0, 1, 50, 95, 99, 100)] == [1, 1, 50, 95, 99, 100]


def test_nearest_rank_never_interpolates() -> None:
    # Wikipedia's worked example of the nearest-rank method.
    values = [15, 20, 35, 40, 50]
    assert [percentile(values, p) for p in (5, 30, 40, 50, 100)] == [15, 20, 20, 35, 50]
    # An even count: the median is the lower middle value, not their mean.
    assert percentile([1, 2, 3, 4], 50) == 2


@pytest.mark.parametrize(("p", "n", "expected"), [(7, 100, 7), (7.0, 100, 7), (99.9, 1000, 999)])
def test_a_whole_rank_is_not_moved_by_float_rounding(p: float, n: int, expected: int) -> None:
    # 7 / 100 * 100 is 7.000000000000001 in floating point: rank 8 if computed naively.
    assert percentile(range(1, n + 1), p) == expected


@pytest.mark.parametrize("p", [-1, 100.5, math.nan, math.inf, True, "50"])
def test_p_outside_zero_to_a_hundred_is_an_error(p: object) -> None:
    with pytest.raises(ValueError, match="from 0 to 100"):
        percentile([1.0], p)  # type: ignore[arg-type]


@given(
    st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50),
    st.floats(min_value=0, max_value=100),
)
def test_the_definition(values: list[float], p: float) -> None:
    found = percentile(values, p)
    assert found in values
    share = Fraction(str(p)) / 100 * len(values)
    # At least p% of the values are at or below it; fewer than p% are below it.
    assert sum(v <= found for v in values) >= share
    assert sum(v < found for v in values) < max(share, 1)

"""One percentile for every report: the nearest-rank method.

The ``p``-th percentile (``0 <= p <= 100``) of ``n`` values is the value at
rank ``ceil(p / 100 * n)`` (1-based, at least 1) of the sorted values: always
one of the values measured, never an interpolation between two. So ``p = 0``
is the minimum, ``p = 100`` the maximum, and the 50th percentile of an even
count is the lower of the two middle values.

The rank is computed exactly, with ``p`` read as the decimal it was written
as: ``7 / 100 * 100`` is ``7.000000000000001`` in floating point, and a rank
that is exactly whole must not move up by one.

Only the standard library is imported: the SDK's reports, the burst tool, the
harness and the benchmarks all use this one function.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from fractions import Fraction
from typing import Any, TypeVar, overload

__all__ = ["percentile"]

T = TypeVar("T")

_NO_DEFAULT: Any = object()


@overload
def percentile(values: Iterable[float], p: float) -> float: ...


@overload
def percentile(values: Iterable[float], p: float, *, default: T) -> float | T: ...


def percentile(values: Iterable[float], p: float, *, default: Any = _NO_DEFAULT) -> Any:
    """The nearest-rank ``p``-th percentile of ``values`` (``0 <= p <= 100``).

    ``values`` need not be sorted. An empty one gives ``default``, or raises
    ``ValueError`` without one, as ``max()`` does.

    >>> percentile([15, 20, 35, 40, 50], 40)
    20
    >>> percentile([], 99, default=None) is None
    True
    """
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p <= 100:
        raise ValueError(f"p must be a number from 0 to 100, got {p!r}")
    ordered = sorted(values)
    if not ordered:
        if default is _NO_DEFAULT:
            raise ValueError("percentile() of an empty sequence has no value (give a default)")
        return default
    rank = math.ceil(Fraction(str(p)) * len(ordered) / 100)
    return ordered[max(rank, 1) - 1]

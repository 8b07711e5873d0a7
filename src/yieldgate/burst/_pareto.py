"""The Pareto front of a report: the runs that did the most good work at the least latency.

Each run (a strategy, at a point of a sweep) is scored on two things a caller
of the whole burst sees:

- **goodput per second** (``StrategyResult.goodput_per_s``): requests that
  succeeded and met every objective, per second of the rates' window (the
  offered window, the makespan or the lower bound, the longest), so a
  strategy that gave up fast is not made fast by giving up;
- **the burst's p99 latency** (``front_latency_s``): the latency within which
  99% of the burst's callers got their answer, a failure counting as an answer
  that never came. It is the successes' p99 when at least 99% of the requests
  (nearest rank, as every percentile here) succeeded, and infinite otherwise:
  the 99th-percentile caller of a strategy that failed more than 1% of the
  burst is still waiting.

A run dominates another when it has at least its goodput and at most its
latency, one of them strictly; the front is the runs no other dominates. So a
strategy that failed most of its requests, however fast it failed, is on the
front only if no run did as much good work; when every run failed more than
1% (a time-out cut the burst, say), the front is the run with the most goodput.
A run with no good request did no work worth ranking and is left out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from yieldgate.burst._results import BurstReport, StrategyResult
from yieldgate.burst._sweep import SweepReport

__all__ = ["Candidate", "candidates", "front_latency_s", "pareto_front"]


def front_latency_s(result: StrategyResult) -> float:
    """The burst's p99 latency, a failure never answered: the successes' p99 when at least
    the nearest rank of the 99th percentile of the requests succeeded, else infinite."""
    p99 = result.latency_s.p99
    if p99 is None or result.succeeded < -(-99 * result.requests // 100):
        return math.inf
    return p99


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the ``(latency, goodput)`` points no other point beats: none has
    latency as low and goodput as high, and one of them strictly. By latency, then
    goodput. A latency may be ``math.inf``."""
    front = []
    for i, (lat, thr) in enumerate(points):
        beaten = any(
            (lo <= lat and hi >= thr) and (lo < lat or hi > thr)
            for j, (lo, hi) in enumerate(points)
            if j != i
        )
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i])


@dataclass(frozen=True, slots=True)
class Candidate:
    """One run that did some good work: its label, its sweep value (``None`` in a burst),
    the result, and its two scores."""

    label: str
    value: float | None
    result: StrategyResult
    latency_s: float
    goodput_per_s: float

    @property
    def on_time(self) -> bool:
        """Whether 99% of the burst was answered (its latency is finite)."""
        return math.isfinite(self.latency_s)


def candidates(report: BurstReport | SweepReport) -> tuple[list[Candidate], list[int]]:
    """Every run with a good request, and the indices of those on the front."""
    rows: list[tuple[float | None, StrategyResult]] = (
        [(v, r) for v, r in report.rows()]
        if isinstance(report, SweepReport)
        else [(None, r) for r in report.results]
    )
    found = [
        Candidate(r.label, v, r, front_latency_s(r), r.goodput_per_s)
        for v, r in rows
        if r.goodput_good > 0 and r.latency_s.p99 is not None
    ]
    return found, pareto_front([(c.latency_s, c.goodput_per_s) for c in found])

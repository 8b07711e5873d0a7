"""Merging the parts of one strategy's run that several worker processes sent.

Every worker counts time from the same ``time.monotonic()`` instant (the
go its parent gave them all; the clock is the machine's, shared by its
processes), so the records need no shifting: the parts are put back
together, each request once, and summarised as if one process had sent
them all. Percentiles come from the merged samples, counters are summed,
and the timelines are added up on the common clock.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from yieldgate.burst._metrics import AttemptRecord
from yieldgate.burst._results import TimelinePoint
from yieldgate.burst._targets import Request

__all__ = ["Part", "merge_requests", "merge_timelines", "split_concurrency", "split_requests"]

_SAME_S = 0.002
_SUMMED = ("client_inflight", "client_attempts", "client_yields", "completed", "failed")


@dataclass(frozen=True, slots=True, kw_only=True)
class Part:
    """What one worker sent back for one strategy: its raw records and its Gate's counts."""

    worker: int
    requests: list[Request]
    timeline: list[TimelinePoint] = field(default_factory=list)
    attempts: int = 0
    yields: int = 0
    attempt_log: list[AttemptRecord] = field(default_factory=list)


def split_requests(requests: int, workers: int) -> list[list[int]]:
    """Request indices per worker, dealt round-robin: each worker's share is a thinned
    copy of the whole arrival process, and together they are the whole of it."""
    if workers < 1:
        raise ValueError("workers must be >= 1")
    return [list(range(w, requests, workers)) for w in range(workers)]


def split_concurrency(concurrency: int | None, workers: int) -> list[int | None]:
    """A concurrency cap shared out between workers (the first ones take the remainder)."""
    if concurrency is None:
        return [None] * workers
    if concurrency < workers:
        raise ValueError("concurrency must be >= workers (each worker needs one slot)")
    base, extra = divmod(concurrency, workers)
    return [base + (1 if w < extra else 0) for w in range(workers)]


def merge_requests(parts: Sequence[Part], requests: int) -> list[Request]:
    """The parts' records in index order; every one of ``requests`` exactly once."""
    merged: list[Request | None] = [None] * requests
    for part in parts:
        for request in part.requests:
            if not 0 <= request.index < requests:
                raise RuntimeError(
                    f"worker {part.worker} sent request {request.index}, not in the run"
                )
            if merged[request.index] is not None:
                raise RuntimeError(f"request {request.index} came back twice")
            merged[request.index] = request
    missing = [i for i, r in enumerate(merged) if r is None]
    if missing:
        raise RuntimeError(f"{len(missing)} requests never came back (first: {missing[0]})")
    return [r for r in merged if r is not None]


def _at(points: Sequence[TimelinePoint], times: Sequence[float], t: float) -> Any:
    """The last of ``points`` taken at or before ``t`` (``None`` before the first)."""
    k = bisect.bisect_right(times, t)
    return points[k - 1] if k else None


def merge_timelines(
    timelines: Sequence[Sequence[TimelinePoint]],
    server: Sequence[tuple[float, Mapping[str, Any]]] = (),
    before: Mapping[str, Any] | None = None,
) -> list[TimelinePoint]:
    """One timeline from the workers': a point at every instant any worker sampled, each
    worker's counts as of its last sample by then, summed; the server's columns from
    ``server`` (``(t_s, counters)`` the parent read), relative to ``before``."""
    ordered = [sorted(points, key=lambda p: p.t_s) for points in timelines]
    times = [[p.t_s for p in points] for points in ordered]
    server_times = [t for t, _ in server]
    instants: list[float] = []
    for t in sorted(p.t_s for points in ordered for p in points):
        # Workers sample on their own ticks: instants closer than this are one.
        if instants and t - instants[-1] < _SAME_S:
            instants[-1] = t
        else:
            instants.append(t)
    merged: list[TimelinePoint] = []
    for t in instants:
        sums = dict.fromkeys(_SUMMED, 0)
        for points, at in zip(ordered, times, strict=True):
            point = _at(points, at, t)
            if point is not None:
                for name in _SUMMED:
                    sums[name] += getattr(point, name)
        k = bisect.bisect_right(server_times, t)
        counters = server[k - 1][1] if k and before is not None else None
        merged.append(
            TimelinePoint(
                t_s=t,
                **sums,
                server_inflight=None if counters is None else int(counters["inflight"]),
                server_executed=None
                if counters is None or before is None
                else int(counters["executed_total"]) - int(before["executed_total"]),
                server_yielded=None
                if counters is None or before is None
                else int(counters["yielded_total"]) - int(before["yielded_total"]),
            )
        )
    return merged

"""What a burst's rates are per second of: its window.

Throughput, goodput and tokens per second divide by ``rate_window_s``, never
by the makespan alone. A strategy that fails most of a burst in a fraction of
a second has a tiny makespan, and its few successes over it would look like a
high rate; but the burst was offered over its arrivals, and serving it needs
at least the lower bound's time. So the window is the longest of:

- the offered window: from the first arrival to the last (0 when every request
  arrives at once), the same for every strategy of a burst since arrivals are
  seeded;
- the makespan: from the first arrival to the last request's end;
- the lower bound, when the server's counters give one: the least time the
  whole burst could take on the server's slots.

A strategy that served everything has a makespan at least its bound (the
bound is the least it could take), so its rates are unchanged; one that failed
fast is measured over the time the burst needed, not over the time it took to
give up. docs/burst.md ("The figures") defines it for users.

``makespan_lower_bound`` is the bound: the least time a burst's executions
could take on the server's slots, as it opens them.
"""

from __future__ import annotations

__all__ = ["makespan_lower_bound", "per_window", "rate_window_s"]


def rate_window_s(offered_s: float, makespan_s: float, lower_bound_s: float | None) -> float:
    """The longest of the offered window, the makespan and the lower bound (when known)."""
    return max(offered_s, makespan_s, 0.0 if lower_bound_s is None else lower_bound_s)


def per_window(count: float, window_s: float) -> float:
    """``count`` per second of ``window_s`` (0 for an empty window)."""
    return count / window_s if window_s > 0 else 0.0


def makespan_lower_bound(
    requests: int,
    exec_s: float,
    max_inflight: int,
    *,
    cold_start_s: float = 0.0,
    ramp_s: float = 0.0,
    last_arrival_s: float = 0.0,
) -> float:
    """The least time ``requests`` executions of ``exec_s`` could take on ``max_inflight``
    slots, when capacity is 0 for ``cold_start_s`` and then rises one slot at a time
    from 1 to ``max_inflight`` over ``ramp_s`` (as the reference server ramps), and
    the last request arrives at ``last_arrival_s``."""
    if requests <= 0 or exec_s <= 0 or max_inflight < 1:
        return 0.0
    step = ramp_s / (max_inflight - 1) if ramp_s > 0 and max_inflight > 1 else 0.0
    opens = [cold_start_s + k * step for k in range(max_inflight)]
    work = requests * exec_s

    def slot_seconds(t: float) -> float:
        return sum(max(0.0, t - o) for o in opens)

    lo, hi = 0.0, cold_start_s + ramp_s + work + exec_s
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if slot_seconds(mid) < work else (lo, mid)
    return max(hi, cold_start_s + exec_s, last_arrival_s + exec_s)

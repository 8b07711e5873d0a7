"""Which upstream an attempt goes to, sans-IO, and the latest it may start.

A Gate over one upstream has no choice to make; over a set, each attempt
goes to the one with the lowest expected latency cost (``_upstream.choose``)
whose breaker lets it through, a retry or a hedge preferring another one
than the attempts before it, and a caller waits for a half-open probe's
verdict only when that is all that stands between it and every upstream.
``not_after`` is how long a caller held back by a hint (the window's, or its
scope's quota's) may wait and still have time for an attempt.
"""

from __future__ import annotations

import math

from yieldgate._exceptions import CircuitOpenError, DeadlineExceededError
from yieldgate.gate._breaker import Breaker
from yieldgate.gate._call import CallState
from yieldgate.gate._upstream import Upstream, choose

__all__ = ["not_after", "order", "upstream"]


def order(call: CallState, now: float) -> list[Upstream]:
    """The upstreams in the order this call should try them (the one, without a set)."""
    ups = call.core.upstreams
    if len(ups) == 1:
        return ups
    return choose(ups, call.priority, now, call.core.rng, _avoid(call))


def _avoid(call: CallState) -> set[Upstream]:
    avoid = set(call.running or ())
    if call.last_failed is not None:
        avoid.add(call.last_failed)
    return avoid


def upstream(call: CallState, now: float) -> Upstream | Breaker:
    """The upstream for the next attempt, or the breaker whose half-open probe's
    verdict to wait for (when only that stands between the call and an
    upstream). Raises ``CircuitOpenError`` when every breaker says no."""
    core = call.core
    ups = core.upstreams
    with core.lock:
        ranked = order(call, now)
        refusal: CircuitOpenError | None = None
        for up in ranked:
            try:
                up.breaker.check()
            except CircuitOpenError as exc:
                # Fail over; report the breaker that will let a probe through first.
                if refusal is None or (exc.retry_after_s or math.inf) < (
                    refusal.retry_after_s or math.inf
                ):
                    refusal = exc
                continue
            return up
        assert refusal is not None
        probing = [u for u in ups if u.breaker.probe_pending]
        if probing:
            return probing[0].breaker
        raise call.circuit_error(refusal)


def not_after(call: CallState, up: Upstream, now: float, *, quota: bool = False) -> float | None:
    """The latest this call can start and still have time for an attempt, for a
    hold that outlasts its deadline (never before the hint itself ends): the
    window's hold, or with ``quota`` the hold of its scope's quota."""
    if call.deadline is None or (quota and not up.quota.lanes.holding):
        return None
    with call.core.lock:
        if quota:
            hint_end = up.quota.lanes.hint_until(call.cost.scope, call.priority, now)
        else:
            hint_end = up.window.hint_until(call.priority, now)
    if not hint_end:
        return None
    if hint_end > call.deadline:
        raise call.error(
            DeadlineExceededError,
            f"the upstream asked to wait {hint_end - now:.3f} s, past the call's deadline "
            f"({call.deadline - now:.3f} s left), after {call.attempts} attempt(s)",
        )
    return call.deadline - call.margin(up, call.deadline - hint_end)

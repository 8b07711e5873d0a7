"""The retry decision, sans-IO: after an outcome, try again (after how long) or stop.

One function, ``decide``, asked by both drivers through the retry loop
(``_retrying``): the caps on attempts and on yields, a hint with its jitter
or a backoff, a shared hint hold waited in the window, a failover to another
upstream of a set, the call's deadline, a breaker that opened meanwhile, and
the retry budget (the Gate's, or the fleet's when it has one). Stopping
sets the call's ``stop_error``. It reads and writes the call's state
(``Deciding``: the part of ``CallState`` it needs), under the Gate's lock.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from yieldgate._exceptions import (
    CircuitOpenError,
    DeadlineExceededError,
    QuotaExhaustedError,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate.gate._cost import DEFAULT_WINDOW_S, MAX_WINDOW_S
from yieldgate.gate._outcome import Outcome, OutcomeKind
from yieldgate.gate._retry import backoff_floor_s, backoff_s, hinted_floor_s, hinted_wait_s

if TYPE_CHECKING:
    from yieldgate.gate._claim import Claim
    from yieldgate.gate._core import GateCore
    from yieldgate.gate._quota import Quota
    from yieldgate.gate._upstream import Upstream
    from yieldgate.protocol import Priority

__all__ = ["Deciding", "decide"]


class Deciding(Protocol):
    """What the decision reads and sets of a call (``CallState``)."""

    core: GateCore
    priority: Priority
    deadline: float | None
    attempts: int
    congestion: int
    last_upstream: Upstream | None
    shared_until: float | None
    withdrawn: int | None
    fleet_retry: bool
    next_wait_s: float
    stop_error: YieldgateError | None

    def error(self, cls: type[YieldgateError], message: str, **extra: Any) -> YieldgateError: ...
    def margin(self, up: Upstream, room: float) -> float: ...


def _stop(call: Deciding, cls: type[YieldgateError], message: str, **extra: Any) -> float:
    call.stop_error = call.error(cls, message, **extra)
    return 0.0


def _refill_at(wait_s: float) -> tuple[float, str]:
    """When a quota ``wait_s`` from now refills: epoch seconds, and as an ISO time."""
    reset_at = time.time() + wait_s
    return reset_at, datetime.fromtimestamp(reset_at, UTC).isoformat(timespec="seconds")


def _quota_spent(call: Deciding, outcome: Outcome, hint: float, left: float) -> float:
    reset_at, when = _refill_at(hint)
    return _stop(
        call,
        QuotaExhaustedError,
        f"the provider's quota is spent until {when} (in {hint:g} s), past the call's "
        f"deadline ({left:.3f} s left) after {call.attempts} attempt(s): {outcome.describe()}",
        reset_s=hint,
        reset_at=reset_at,
        reason=outcome.reason,
    )


def quota_past_deadline(
    call: Any, quota: Quota, claim: Claim, now: float, again: float
) -> YieldgateError:
    """The error of a ``call`` whose quota claim has room only at ``again``, past its
    deadline: a spent daily (or longer) learnt bucket's is ``QuotaExhaustedError``
    naming its refill; any other, ``DeadlineExceededError``."""
    bucket = quota.binding(claim.cost, now)
    if bucket is None or not bucket.learnt or bucket.limit <= bucket.rate * MAX_WINDOW_S:
        error: YieldgateError = call.deadline_error(quota.beyond(claim, now, again))
        return error
    wait = again - now
    reset_at, when = _refill_at(wait)
    window_h = bucket.limit / bucket.rate / 3600
    error = call.error(
        QuotaExhaustedError,
        f"quota bucket {bucket.key!r} (a {window_h:.3g} h window) has room only at {when} "
        f"(in {wait:.3g} s), past the call's deadline",
        reset_s=wait,
        reset_at=reset_at,
        reason="daily_quota",
    )
    return error


def _elsewhere(call: Deciding, last: Upstream, now: float) -> bool:
    """Whether an upstream other than ``last`` could take an attempt now."""
    ups = call.core.upstreams
    if len(ups) == 1:
        return False
    return any(up is not last and up.takes(call.priority, now) for up in ups)


def decide(call: Deciding, outcome: Outcome, now: float) -> float:
    """Whether to try again after ``outcome`` and after how long (under the lock)."""
    core = call.core
    policy = core.policy.retry
    if outcome.is_congestion:
        call.congestion += 1
        if call.congestion > policy.max_yields:
            return _stop(
                call,
                YieldExhaustedError,
                f"upstream still congested after {call.congestion} yield(s)/overload(s): "
                f"{outcome.describe()}",
            )
        n = call.congestion
    else:
        n = call.attempts - call.congestion
        if n >= policy.max_attempts:
            return _stop(
                call,
                RetriesExhaustedError,
                f"gave up after {n} failed attempt(s): {outcome.describe()}",
            )
    hint = outcome.hint_s if policy.honour_hints else None
    last = call.last_upstream
    hold_left = 0.0
    if last is not None and _elsewhere(call, last, now):
        # Another upstream of the set can take the retry now: the hint or the
        # backoff was about the one that just answered. A short jitter only.
        wait = core.rng.uniform(0, policy.base_s)
        floor = 0.0
    elif hint is not None:
        wait = hinted_wait_s(policy, hint, core.rng, n)
        floor = hinted_floor_s(policy, hint, n)
        shared = call.shared_until
        if shared is not None and now + floor <= shared:
            # The hint this call got holds the upstream for every caller, and
            # its end (with the jitter) is this call's wait too: it waits in the
            # window, in its place among them, where a completion may admit it
            # early. Its own sleep would put it behind all who came later.
            hold_left = shared - now
            wait = 0.0
    else:
        wait = backoff_s(policy, n, core.rng)
        floor = backoff_floor_s(policy, n)
    if call.deadline is not None:
        # Give up only when even the least wait would overrun the deadline.
        # The jitter above it is trimmed so that the retry still starts with
        # an attempt's worth of time left, never at the deadline itself.
        left = call.deadline - now
        if hint is not None and floor > 0.0 and hint > left:
            # The upstream's own word, before ``max_hint_s`` caps it: a wait past the
            # deadline (Azure's "retry after 86400 seconds") fails the call now, not
            # at its deadline after holding every caller behind it. A quota's refusal
            # (a daily one's, or a hint longer than a minute's quota takes to refill)
            # is the quota spent: ``QuotaExhaustedError``, naming when it refills.
            if outcome.reason == "daily_quota" or (
                outcome.reason == "rate_limited" and hint > DEFAULT_WINDOW_S
            ):
                return _quota_spent(call, outcome, hint, left)
            return _stop(
                call,
                DeadlineExceededError,
                f"the upstream asked to wait {hint:g} s, which would pass the call's deadline "
                f"({left:.3f} s left) after {call.attempts} attempt(s): {outcome.describe()}",
            )
        if floor > left:
            return _stop(
                call,
                DeadlineExceededError,
                f"the next wait ({floor:.3f} s at least) would pass the call's deadline "
                f"({left:.3f} s left) after {call.attempts} attempt(s): {outcome.describe()}",
            )
        up = last if last is not None else core.upstreams[0]
        wait = min(wait, left - call.margin(up, left - floor))
    retry_after = min(u.breaker.retry_after_s() for u in core.upstreams)
    if retry_after > max(wait, hold_left):
        # The breaker opened meanwhile and will still be open when we wake.
        return _stop(
            call,
            CircuitOpenError,
            f"circuit opened while retrying; next probe in {retry_after:.2f} s: "
            f"{outcome.describe()}",
            retry_after_s=retry_after,
        )
    if outcome.kind is not OutcomeKind.YIELD:
        if core.shared is not None and core.shared.available:
            call.fleet_retry = True  # the fleet's budget is asked before it is sent
        else:
            receipt = core.withdraw()
            if receipt is None:
                return _stop(
                    call,
                    RetryBudgetExhaustedError,
                    f"retry budget spent (too many retries recently): {outcome.describe()}",
                )
            call.withdrawn = receipt  # refunded if the call stops before sending it
    call.next_wait_s = max(wait, hold_left)
    return wait

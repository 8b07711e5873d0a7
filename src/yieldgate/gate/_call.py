"""One call's decisions, sans-IO: admit, begin and end attempts, retry or give up.

``CallState`` holds what one call carries across its attempts and makes every
decision about it from the state it is given and the time: which upstream
an attempt goes to, whether it may start now or must wait (and for what),
what an outcome does to the window, the breaker and the hint holds, and
whether to try again and after how long. It never waits, sleeps or calls
the user's function: the drivers do (``_async`` for asyncio and trio,
``_sync`` for threads), and both ask this one object. Every method takes the
Gate's lock itself, so the drivers cannot forget it.
"""

from __future__ import annotations

from typing import Any, Final

from yieldgate._exceptions import (
    AttemptTimeoutError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    RequestTooLargeError,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate.gate._attempt import Attempt, Slot
from yieldgate.gate._breaker import Verdict
from yieldgate.gate._core import GateCore
from yieldgate.gate._outcome import Outcome, OutcomeKind
from yieldgate.gate._quota import BLIND, NOTHING, ONE_REQUEST, Claim, Cost, Quota, QuotaReading
from yieldgate.gate._retry import backoff_floor_s, backoff_s, hinted_floor_s, hinted_wait_s
from yieldgate.gate._shared import FleetOp
from yieldgate.gate._telemetry import NULL_OBSERVER, AttemptDetails, CallObserver, WaitDetails
from yieldgate.gate._upstream import Upstream
from yieldgate.gate._window import RANK, Permit, Signal
from yieldgate.protocol import Priority

__all__ = ["CallState"]

# What each kind of outcome tells the window and the breaker.
SIGNALS: Final = {
    OutcomeKind.OK: (Signal.SUCCESS, Verdict.SUCCESS),
    OutcomeKind.YIELD: (Signal.REFUSED, Verdict.NEUTRAL),
    OutcomeKind.OVERLOADED: (Signal.CONGESTION, Verdict.NEUTRAL),
    OutcomeKind.RETRYABLE: (Signal.FAILURE, Verdict.FAILURE),
    OutcomeKind.FATAL: (Signal.FAILURE, Verdict.NEUTRAL),
}


class CallState:
    """One call's state across its attempts (see the module docstring)."""

    # Set as the call goes; until then the class's defaults stand (most calls
    # never set most of them, and a call is built on the hot path).
    congestion: int = 0  # yields and overloads so far
    last: Outcome | None = None
    last_hint_s: float | None = None
    stop_error: YieldgateError | None = None
    # The wait decided for the next attempt (reported before it begins).
    next_wait_s: float = 0.0
    # The attempt whose success is the call's (the first to succeed), its outcome,
    # and the slot it keeps for a call that holds (released by the Lease).
    winner: Attempt | None = None
    won: Outcome | None = None
    held: tuple[Upstream, Permit] | None = None
    # The upstream that failed this call last, and the one that answered last.
    last_failed: Upstream | None = None
    last_upstream: Upstream | None = None
    # Set by a yield or an overload: no more hedges for this call.
    hedging_off: bool = False
    # When the hold that this call's last hint set ends (None: it set none).
    shared_until: float | None = None
    # A retry taken from the budget and not sent yet: refunded if never sent.
    withdrawn: int | None = None
    # In a fleet: a retry whose budget the fleet must grant before it is sent, and
    # the fleet's receipt for it (given back if the call stops before sending it).
    fleet_retry: bool = False
    fleet_receipt: int | None = None
    # What each attempt spends of the upstream's quota (given by the caller, or
    # estimated by a transport from the request): one request, tokens unknown.
    cost: Cost = ONE_REQUEST

    def __init__(
        self,
        core: GateCore,
        priority: Priority,
        deadline: float | None,
        started: float,
        *,
        hold: bool,
        observer: CallObserver,
        task: object,
    ) -> None:
        self.core = core
        self.priority = priority
        self.deadline = deadline
        self.started = started
        self.hold = hold
        self.observer = observer
        self.task = task  # where the call runs: a call of this Gate from there is nested
        self.hedge = core.policy.hedge
        self.attempts = 0
        # Upstreams this call's attempts are using now (tracked for a set or hedging only).
        self.running: list[Upstream] | None = [] if core.named or self.hedge is not None else None

    # -- the quota ----------------------------------------------------------

    def claim(self) -> Claim:
        """This call's next attempt's claim on an upstream's quota."""
        return Claim(self.cost, self.priority, self.started)

    def too_large(self, quota: Quota) -> None:
        """Raise ``RequestTooLargeError`` if no wait can make this call's cost fit."""
        bucket = quota.too_large(self.cost)
        if bucket is None:
            return
        amount = self.cost.amount(bucket.resource)
        raise self.error(
            RequestTooLargeError,
            f"the request costs {amount} {bucket.resource.replace('_', ' ')}, more than the "
            f"whole quota ({bucket.key}: {bucket.limit:g}): no wait makes it fit",
            resource=bucket.resource,
            cost=amount,
            limit=bucket.limit,
        )

    def observe(self, attempt: Attempt, readings: tuple[QuotaReading, ...]) -> None:
        """A response's quota readings, for the upstream ``attempt`` went to."""
        core = self.core
        slot = attempt.slot
        with core.lock:
            slot.upstream.quota.observe(readings, slot.claim, core.clock())
            if core.shared is not None:
                core.shared.observe(slot.upstream, slot.claim, readings)

    def used(self, attempt: Attempt, used: Cost) -> None:
        """What ``attempt`` really used: the caller's own budgets are settled by it."""
        core = self.core
        with core.lock:
            if attempt.settled:
                return
            attempt.settled = True
            attempt.slot.upstream.quota.settle_own(attempt.slot.claim, used, core.clock())
            if core.shared is not None:
                core.shared.settle(attempt.slot.upstream, attempt.slot.claim, used)

    # -- errors -------------------------------------------------------------

    def error(self, cls: type[YieldgateError], message: str, **extra: Any) -> YieldgateError:
        return cls(
            message, attempts=self.attempts, last_hint_s=self.last_hint_s, last_outcome=self.last,
            **extra,
        )  # fmt: skip

    def deadline_error(self, while_: str) -> YieldgateError:
        return self.error(
            DeadlineExceededError,
            f"call exceeded its total timeout {while_} after {self.attempts} attempt(s)",
        )

    def circuit_error(self, exc: CircuitOpenError) -> CircuitOpenError:
        self.core.counters.rejected_open += 1
        return CircuitOpenError(
            exc.message,
            retry_after_s=exc.retry_after_s,
            attempts=self.attempts,
            last_hint_s=self.last_hint_s,
            last_outcome=self.last,
        )

    def finish(self, outcome: Outcome) -> Any:
        """The call's value, or the error it ends with."""
        if outcome.kind is OutcomeKind.OK:
            return outcome.value
        if self.stop_error is not None:
            raise self.stop_error from outcome.error
        raise self.error(CallFailedError, f"call failed: {outcome.describe()}") from outcome.error

    def forget(self) -> None:
        """Drop the values the call carried, once it is over.

        Timers armed during an attempt keep a copy of its context, which holds
        the attempt and so this call, until they fire or are purged: the
        response must not live that long with them.
        """
        self.last = None
        self.won = None
        if self.held is None:  # a held slot's Lease still reads its winner's claim
            self.winner = None

    def margin(self, up: Upstream, room: float) -> float:
        """How long before the deadline an attempt should start, out of ``room``: its
        expected duration (the upstream's recent latency), else half the room."""
        latency = up.latency.ewma_s
        return min(room, room / 2 if latency is None else latency)

    # -- attempts -----------------------------------------------------------

    def begin(self, slot: Slot, now: float) -> Attempt:
        """Start an attempt on ``slot``: count it, and fix its deadline (its own
        timeout or the call's, whichever ends first)."""
        core = self.core
        number = self.attempts + 1
        up = slot.upstream
        with core.lock:
            if (slot.waited or number > 1) and self.deadline is not None:
                left = self.deadline - now
                expected = up.latency.ewma_s
                if left <= 0 or (expected is not None and left < expected):
                    # Admitted too late to finish: an attempt now would hold a slot
                    # (the server's and ours) for an answer nobody waits for.
                    up.window.release(slot.permit, Signal.CANCELLED)
                    up.breaker.record(slot.ticket, Verdict.NEUTRAL)
                    if left <= 0:
                        raise self.deadline_error("before an attempt could start")
                    raise self.deadline_error(
                        f"before an attempt could start: {left:.3f} s left, and an attempt "
                        f"takes about {expected:.3f} s"
                    )
            self.attempts = number
            self.withdrawn = None  # the retry it paid for is being sent
            if slot.claim is BLIND:
                if self.cost is ONE_REQUEST:
                    up.quota.blind_requests += 1
                else:
                    up.quota.blind(self.cost, 1)
            else:
                up.quota.sent(slot.claim, now)  # the provider counts it from its arrival
            core.counters.attempts += 1
            if number == 1:
                # A request, for the retry budget, is a call that sent something.
                core.budget.deposit(now)
                if core.shared is not None and core.shared.available:
                    core.shared.deposits += 1  # told the fleet in batches
            self.fleet_receipt = None  # the retry it paid for is being sent
            if self.running is not None:
                self.running.append(up)
        attempt_s = core.policy.timeout.attempt_s
        deadline = self.deadline
        if attempt_s is not None and (deadline is None or now + attempt_s < deadline):
            deadline = now + attempt_s
        return Attempt(self, number, slot, now, deadline)

    def timed_out(self, attempt: Attempt) -> Outcome:
        """The outcome of an attempt that ran out of time: past the call's deadline
        it ends the call (raised), past its own timeout it may be retried."""
        if self.deadline is not None and attempt.deadline == self.deadline:
            raise self.deadline_error("during an attempt")
        attempt_s = self.core.policy.timeout.attempt_s
        return Outcome.retryable(
            AttemptTimeoutError(
                f"attempt {attempt.number} ran past {attempt_s} s", attempts=attempt.number
            )
        )

    def end(self, attempt: Attempt, outcome: Outcome | None, now: float) -> bool:
        """An attempt is over (``outcome`` ``None``: cancelled). Gives its slot back
        (or keeps it for a holding call's winner), reports to the breaker, shares
        a hint, and counts. ``True``: its value lost a race and must be discarded."""
        core = self.core
        slot = attempt.slot
        up = slot.upstream
        verdict = Verdict.NEUTRAL
        if outcome is None:
            signal = Signal.CANCELLED
        elif outcome.kind is OutcomeKind.OK:
            signal, verdict = Signal.SUCCESS, Verdict.SUCCESS
        else:
            signal, verdict = SIGNALS[outcome.kind]
            if isinstance(outcome.error, AttemptTimeoutError):
                # A timeout is what a backend that buffers instead of yielding
                # shows under overload: narrow the window as for a yield.
                signal = Signal.CONGESTION
        with core.lock:
            if signal is not Signal.SUCCESS and outcome is not None and outcome.is_congestion:
                # Held before the slot goes back: else the freed slot would
                # admit a waiter into the very overload the hint is about.
                self._hold_from(outcome, up, now)
            if self.running is not None:
                self.running.remove(up)
            if slot.claim is BLIND:
                if self.cost is ONE_REQUEST:
                    up.quota.blind_requests -= 1
                else:
                    up.quota.blind(self.cost, -1)
            else:
                up.quota.finished(slot.claim)
            won = signal is Signal.SUCCESS and self.winner is None
            shared = core.shared
            if shared is not None:
                if won and self.hold:
                    slot.claim.lease_held = True  # given back with the window slot
                hint = None
                if outcome is not None and outcome.is_congestion:
                    hint = outcome.hint_s
                shared.ended(up, slot.claim, hold_s=hint, rank=RANK[self.priority])
            if won:
                self.winner = attempt
                self.won = outcome
            elif signal is Signal.CANCELLED and self.winner is not None:
                core.counters.losers_cancelled += 1
                # It lost the race: slower than the winner, at least this slow.
                up.latency.record_at_least(now - attempt.started)
            if won and self.hold:
                self.held = (up, slot.permit)  # released by the Lease
            else:
                up.window.release(slot.permit, signal)
            up.breaker.record(slot.ticket, verdict, None if outcome is None else outcome.error)
            if shared is not None and verdict is not Verdict.NEUTRAL:
                shared.verdict(up, verdict is Verdict.SUCCESS, probe=slot.ticket.probe)
            if outcome is not None:
                self._note(outcome, attempt, now)
        return signal is Signal.SUCCESS and not won

    def _hold_from(self, outcome: Outcome, up: Upstream, now: float) -> None:
        """Share a congestion hint: hold the upstream's admissions at this priority
        and below until it (with its jitter) has passed."""
        self.shared_until = None
        retry = self.core.policy.retry
        if outcome.hint_s is None or not (retry.share_hints and retry.honour_hints):
            return
        hint = min(outcome.hint_s, retry.max_hint_s)
        if hint <= 0:
            return  # "come back now": nothing to hold (the retry spreads and backs off)
        # The callers held behind the hint go one by one over its jitter, as
        # their own jittered waits would have spread them, but in their order.
        until = now + hint * (1.0 + retry.hint_jitter)
        up.window.hold(self.priority, until, now + hint)
        self.shared_until = until

    def _note(self, outcome: Outcome, attempt: Attempt, now: float) -> None:
        core = self.core
        up = attempt.slot.upstream
        self.last = outcome
        self.last_upstream = up
        if outcome.hint_s is not None:
            self.last_hint_s = outcome.hint_s
        kind = outcome.kind
        congestion = kind is OutcomeKind.YIELD or kind is OutcomeKind.OVERLOADED
        if not congestion:
            self.shared_until = None
        counters = core.counters
        if kind is OutcomeKind.OK:
            # Latencies feed hedge delays, the choice of upstream, and whether a call
            # admitted late still has time for an attempt (``begin``).
            if core.named or self.hedge is not None or self.deadline is not None:
                up.latency.record(now - attempt.started)
                if up.latency is not core.latency:  # a member of a set: the Gate's too
                    core.latency.record(now - attempt.started)
            if self.last_failed is up:
                self.last_failed = None
        elif kind is OutcomeKind.YIELD:
            counters.yields += 1
            if not attempt.settled:
                # Refused at the door, before any work: it used nothing.
                attempt.settled = True
                up.quota.settle_own(attempt.slot.claim, NOTHING, now)
                if core.shared is not None:
                    core.shared.settle(up, attempt.slot.claim, NOTHING)
        elif kind is OutcomeKind.OVERLOADED:
            counters.overloads += 1
        else:
            counters.failures += 1
            self.last_failed = up
        if core.named:
            failure = kind is OutcomeKind.RETRYABLE or kind is OutcomeKind.FATAL
            up.note(ok=kind is OutcomeKind.OK, congestion=congestion, failure=failure)
        if congestion:
            # "Too much load" from any attempt: hedging would only add to it.
            self.hedging_off = True
        if outcome.reason == "cold_start" and core.rate is not None:
            core.rate.restart_ramp(now)
        if self.observer is not NULL_OBSERVER:
            self.observer.on_attempt(
                AttemptDetails(
                    gate=core.name,
                    attempt=attempt.number,
                    outcome=kind,
                    reason=outcome.reason,
                    hint_s=outcome.hint_s,
                    duration_s=now - attempt.started,
                )
            )

    def abandon(self) -> tuple[bool, Any]:
        """The call ends in an exception: give back what it still holds.

        A retry drawn from the budget but never sent goes back to it. A call
        that meant to hold its winner's slot but ends without handing out a
        ``Lease`` releases the slot. Returns whether a won value is left to
        discard, and the value.
        """
        core = self.core
        with core.lock:
            if self.withdrawn is not None:
                core.budget.refund(self.withdrawn)
                self.withdrawn = None
            if self.fleet_receipt is not None and core.shared is not None:
                policy = core.policy.budget
                args = (core.name, policy, self.fleet_receipt)
                core.shared.backlog.append(FleetOp("refund_retry", args))
                self.fleet_receipt = None
            held, self.held = self.held, None
            if held is None:
                return False, None
            held[0].window.release(held[1], Signal.CANCELLED)
            winner = self.winner
            if core.shared is not None and winner is not None:
                winner.slot.claim.lease_held = False
                core.shared.ended(held[0], winner.slot.claim, hold_s=None, rank=0)
        won = self.won
        return (won is not None, None if won is None else won.value)

    # -- retrying -----------------------------------------------------------

    def _elsewhere(self, last: Upstream, now: float) -> bool:
        """Whether an upstream other than ``last`` could take an attempt now."""
        ups = self.core.upstreams
        if len(ups) == 1:
            return False
        return any(up is not last and up.takes(self.priority, now) for up in ups)

    def decide(self, outcome: Outcome, now: float) -> float:
        """Whether to try again after ``outcome`` and after how long. Stopping sets
        ``stop_error`` (and returns 0.0); so does nothing else."""
        with self.core.lock:
            return self._decide(outcome, now)

    def _decide(self, outcome: Outcome, now: float) -> float:
        core = self.core
        policy = core.policy.retry
        if outcome.is_congestion:
            self.congestion += 1
            if self.congestion > policy.max_yields:
                return self._stop(
                    YieldExhaustedError,
                    f"upstream still congested after {self.congestion} yield(s)/overload(s): "
                    f"{outcome.describe()}",
                )
            n = self.congestion
        else:
            n = self.attempts - self.congestion
            if n >= policy.max_attempts:
                return self._stop(
                    RetriesExhaustedError,
                    f"gave up after {n} failed attempt(s): {outcome.describe()}",
                )
        hint = outcome.hint_s if policy.honour_hints else None
        last = self.last_upstream
        hold_left = 0.0
        if last is not None and self._elsewhere(last, now):
            # Another upstream of the set can take the retry now: the hint or the
            # backoff was about the one that just answered. A short jitter only.
            wait = core.rng.uniform(0, policy.base_s)
            floor = 0.0
        elif hint is not None:
            wait = hinted_wait_s(policy, hint, core.rng, n)
            floor = hinted_floor_s(policy, hint, n)
            shared = self.shared_until
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
        if self.deadline is not None:
            # Give up only when even the least wait would overrun the deadline.
            # The jitter above it is trimmed so that the retry still starts with
            # an attempt's worth of time left, never at the deadline itself.
            left = self.deadline - now
            if floor > left:
                return self._stop(
                    DeadlineExceededError,
                    f"the next wait ({floor:.3f} s at least) would pass the call's deadline "
                    f"({left:.3f} s left) after {self.attempts} attempt(s): {outcome.describe()}",
                )
            up = last if last is not None else core.upstreams[0]
            wait = min(wait, left - self.margin(up, left - floor))
        retry_after = min(u.breaker.retry_after_s() for u in core.upstreams)
        if retry_after > max(wait, hold_left):
            # The breaker opened meanwhile and will still be open when we wake.
            return self._stop(
                CircuitOpenError,
                f"circuit opened while retrying; next probe in {retry_after:.2f} s: "
                f"{outcome.describe()}",
                retry_after_s=retry_after,
            )
        if (
            outcome.kind is not OutcomeKind.YIELD
            and core.shared is not None
            and (core.shared.available)
        ):
            self.fleet_retry = True  # the fleet's budget is asked before it is sent
        elif outcome.kind is not OutcomeKind.YIELD:
            receipt = core.budget.withdraw()
            if receipt is None:
                return self._stop(
                    RetryBudgetExhaustedError,
                    f"retry budget spent (too many retries recently): {outcome.describe()}",
                )
            self.withdrawn = receipt  # refunded if the call stops before sending it
        self.next_wait_s = max(wait, hold_left)
        return wait

    def before_wait(self, outcome: Outcome) -> None:
        """A retry was decided and its wait begins: count it and report it."""
        core = self.core
        with core.lock:
            core.counters.retries += 1
        if self.observer is not NULL_OBSERVER:
            self.observer.on_wait(
                WaitDetails(
                    gate=core.name,
                    next_attempt=self.attempts + 1,
                    wait_s=self.next_wait_s,
                    cause=outcome.kind,
                    hint_s=outcome.hint_s,
                )
            )

    def _stop(self, cls: type[YieldgateError], message: str, **extra: Any) -> float:
        self.stop_error = self.error(cls, message, **extra)
        return 0.0

    def hedge_delay(self, up: Upstream) -> float:
        """How long the attempts so far may stay unanswered before the next hedge."""
        hedge = self.hedge
        assert hedge is not None
        if hedge.delay_s is not None:
            return max(hedge.delay_s, hedge.min_delay_s)
        with self.core.lock:
            tracker = up.latency if len(up.latency) >= hedge.min_samples else self.core.latency
            if len(tracker) < hedge.min_samples:
                return max(hedge.initial_delay_s, hedge.min_delay_s)
            observed = tracker.quantile(hedge.quantile)
        assert observed is not None
        return max(observed, hedge.min_delay_s)

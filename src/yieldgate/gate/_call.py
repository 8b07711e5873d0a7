"""One call's decisions, sans-IO: begin and end attempts, retry or give up.

``CallState`` holds what one call carries across its attempts and makes every
decision about it from the state it is given and the time: whether an
admitted attempt still has time to be sent, what an outcome does to the
window, the breaker and the hint holds, and whether to try again and after
how long. It never waits, sleeps or calls the user's function: the drivers
do (``_async`` for asyncio and trio, ``_sync`` for threads), and both ask
this one object (admission's waits are ``_admission``'s). Every method takes
the Gate's lock itself, so the drivers cannot forget it, and runs no user
code under it.

What the call itself holds, beyond its attempts' ledgers (``_ledger``), is
entered here when acquired and given back by ``close``, which its driver
calls in a ``finally``: a retry drawn from the budget and not sent yet (the
Gate's or the fleet's), a grant the fleet answered that admission has not
entered in a ledger yet (``granted``), and the winner's slot kept for a call
that holds, with the ``Lease`` made for it in the same step, until the call
hands that ``Lease`` out.
"""

from __future__ import annotations

from typing import Any, Protocol

from yieldgate._exceptions import (
    AttemptTimeoutError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    QuotaExhaustedError,
    RequestTooLargeError,
    YieldgateError,
)
from yieldgate.gate._breaker import Verdict
from yieldgate.gate._core import GateCore, Held
from yieldgate.gate._decide import decide
from yieldgate.gate._lease import Lease
from yieldgate.gate._ledger import Attempt
from yieldgate.gate._outcome import Outcome, OutcomeKind, plain_success
from yieldgate.gate._quota import ONE_REQUEST, Cost, Quota
from yieldgate.gate._shared import FleetOp, given_back
from yieldgate.gate._signals import judge
from yieldgate.gate._telemetry import NULL_OBSERVER, AttemptDetails, CallObserver, WaitDetails
from yieldgate.gate._upstream import Upstream
from yieldgate.gate._window import RANK, Signal
from yieldgate.protocol import Priority

__all__ = ["CallSignal", "CallState"]

# A fatal outcome's reasons that say a provider's quota is spent, its reset unknown.
QUOTA_SPENT = ("daily_quota", "no_quota", "insufficient_quota")


class CallSignal(Protocol):
    """How a driver is woken while it waits for this call (its task's or thread's)."""

    def wake(self) -> None: ...
    def clear(self) -> None: ...


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
    # the slot it keeps for a call that holds, and the Lease that gives it back
    # (kept here, from the step that makes both, until the call hands it out).
    winner: Attempt | None = None
    won: Outcome | None = None
    held: Held | None = None
    lease: Lease | None = None
    # A fleet operation and its answer, from the step the answer comes (the driver's)
    # until admission enters what it grants in a ledger (and clears this): given back
    # by ``close`` if something (an interrupt) comes between.
    granted: tuple[FleetOp, Any] | None = None
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
    # How the driver running the call is woken (set by the driver before it waits).
    signal: CallSignal

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

    def attempt(self) -> Attempt:
        """A new attempt, its ledger empty: the driver closes it in a ``finally``."""
        return Attempt(
            self.core, self.priority, self.cost, self.started, self.deadline, self.hedge is not None
        )

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
        if outcome.reason in QUOTA_SPENT:
            # A quota no wait within the call refills (a daily one, a billing one).
            raise self.error(
                QuotaExhaustedError,
                f"the provider's quota is spent and its reset unknown: {outcome.describe()}",
                reason=outcome.reason,
            ) from outcome.error
        # A provider's "Request too large": more than its whole quota, as the Gate's own
        # check says of a cost it knows (the provider's limit, its amount: not told).
        cls = RequestTooLargeError if outcome.reason == "request_too_large" else CallFailedError
        raise self.error(cls, f"call failed: {outcome.describe()}") from outcome.error

    def forget(self) -> None:
        """Drop the values the call carried, once it is over.

        Timers armed during an attempt keep a copy of its context, which holds
        the attempt, until they fire or are purged: the response must not live
        that long with them.
        """
        self.last = None
        self.won = None
        self.winner = None  # a held slot's Lease keeps its own

    def margin(self, up: Upstream, room: float) -> float:
        """How long before the deadline an attempt should start, out of ``room``: its
        expected duration (the upstream's recent latency), else half the room."""
        latency = up.latency.ewma_s
        return min(room, room / 2 if latency is None else latency)

    # -- attempts -----------------------------------------------------------

    def begin(self, attempt: Attempt, now: float, *, waited: bool) -> None:
        """Send an admitted attempt: count it, and fix its deadline (its own
        timeout or the call's, whichever ends first). Raises if it was admitted
        too late to finish (its ledger, given back by its owner, returns it all)."""
        core = self.core
        up = attempt.upstream
        with core.lock:
            if (waited or self.attempts) and self.deadline is not None:
                left = self.deadline - now
                expected = up.latency.ewma_s
                if left <= 0 or (expected is not None and left < expected):
                    # Admitted too late to finish: an attempt now would hold a slot
                    # (the server's and ours) for an answer nobody waits for.
                    if left <= 0:
                        raise self.deadline_error("before an attempt could start")
                    raise self.deadline_error(
                        f"before an attempt could start: {left:.3f} s left, and an attempt "
                        f"takes about {expected:.3f} s"
                    )
            self.sent(attempt, now)

    def sent(self, attempt: Attempt, now: float) -> None:
        """The attempt goes out now (under the lock): counted, its claim in flight, the
        retry it paid for spent, its start and deadline fixed (its own timeout or the
        call's, whichever ends first)."""
        core = self.core
        number = self.attempts = attempt.number = self.attempts + 1
        attempt.send(now, core.policy.timeout.attempt_s)
        if self.withdrawn is not None:  # the retry it paid for is being sent
            core.draws -= 1
            self.withdrawn = None
        self.fleet_receipt = None
        core.counters.attempts += 1
        if number == 1:
            # A request, for the retry budget, is a call that sent something.
            core.budget.deposit(now)
            if core.shared is not None and core.shared.available:
                core.shared.deposits += 1  # told the fleet in batches
        if self.running is not None:
            self.running.append(attempt.upstream)

    def timed_out(self, attempt: Attempt) -> Outcome | None:
        """``attempt_timed_out`` for this call's attempt."""
        return attempt_timed_out(self.core, attempt)

    def end(
        self, attempt: Attempt, outcome: Outcome | None, now: float, *, cut: bool = False
    ) -> bool:
        """An attempt is over (``outcome`` ``None``: cancelled, or ``cut`` at the call's
        deadline). Closes its ledger (or moves a holding call's winning slot to a
        lease), reports to the breaker, shares a hint, counts, and tells the
        observer. ``True``: its value lost a race and must be discarded."""
        core = self.core
        up = attempt.up
        if not attempt.sent or up is None:
            with core.lock:
                attempt.ended = True  # with its give-back, in one step: never one alone
                attempt.give_back(now)
            core.after_lock()
            return False
        if outcome is not None and plain_success(outcome):
            # A plain success (most attempts): what ``judge`` says of it, without
            # building its questions.
            signal, verdict, error = Signal.SUCCESS, Verdict.SUCCESS, None
        else:
            spent = outcome is not None and bool(self._quota_scope(outcome))
            signal, verdict, error = judge(
                outcome, cut=cut, slow=lambda: self._slow(up, attempt, now), spent=spent
            )
        details = None
        with core.lock:
            if attempt.ended:  # pragma: no cover - ended by another path meanwhile
                return False
            attempt.ended = True  # with its give-back, in one step: never one alone
            if signal is not Signal.SUCCESS and outcome is not None and outcome.is_congestion:
                # Held before the slot goes back: else the freed slot would
                # admit a waiter into the very overload the hint is about.
                self._hold_from(outcome, up, now)
            if self.running is not None:
                self.running.remove(up)
            won = signal is Signal.SUCCESS and self.winner is None
            if won:
                self.winner = attempt
                self.won = outcome
                if self.hold:
                    # The slot (and its fleet lease) moves to the call's Lease, at once:
                    # its finalizer owns it from this step on.
                    held = self.held = Held(core, up, attempt.permit, attempt.lease)
                    attempt.permit = attempt.lease = None
                    core.held.add(held)
                    self.lease = Lease(held, attempt)
            elif signal is Signal.CANCELLED and self.winner is not None:
                core.counters.losers_cancelled += 1
                # It lost the race: slower than the winner, at least this slow.
                up.latency.record_at_least(now - attempt.started)
            attempt.give_back(now, signal, verdict, error)
            if outcome is not None:
                details = self._note(outcome, attempt, up, now)
        if core.events:
            core.deliver()
        if details is not None:
            core.hook(self.observer.on_attempt, details)
        return signal is Signal.SUCCESS and not won

    def _slow(self, up: Upstream, attempt: Attempt, now: float) -> bool:
        """Whether the attempt ran at least as long as the upstream usually takes."""
        expected = up.latency.ewma_s
        return expected is None or now - attempt.started >= expected

    def _hold_from(self, outcome: Outcome, up: Upstream, now: float) -> None:
        """Share a congestion hint: hold the upstream's admissions at this priority
        and below until it (with its jitter) has passed; a provider's refusal for
        the quota of this call's scope (a model, a deployment) holds that scope's
        claims alone, in the quota's lanes: the other scopes' quotas have room of
        their own."""
        self.shared_until = None
        retry = self.core.policy.retry
        if outcome.hint_s is None or not (retry.share_hints and retry.honour_hints):
            return
        hint = min(outcome.hint_s, retry.max_hint_s)
        if hint <= 0:
            return  # "come back now": nothing to hold (the retry spreads and backs off)
        # The callers held behind the hint go one by one over its jitter, as
        # their own jittered waits would have spread them, but in their order.
        scope = self._quota_scope(outcome)
        if scope:
            until = up.quota.lanes.hold(scope, self.priority, hint, now)
        else:
            until = now + hint * (1.0 + retry.hint_jitter)
            up.window.hold(self.priority, until, now + hint)
        self.shared_until = until
        shared = self.core.shared
        if shared is not None and outcome.hint_s is not None:
            shared.hold(up, RANK[self.priority], outcome.hint_s, scope)

    def _quota_scope(self, outcome: Outcome) -> str:
        """The scope whose quota ``outcome`` says is spent (a provider's refusal of a
        call that names a model or a deployment); ``""``: none, or the upstream's."""
        return self.cost.scope if outcome.reason in ("rate_limited", "daily_quota") else ""

    def _note(
        self, outcome: Outcome, attempt: Attempt, up: Upstream, now: float
    ) -> AttemptDetails | None:
        core = self.core
        self.last = outcome
        self.last_upstream = up
        if outcome.hint_s is not None:
            self.last_hint_s = outcome.hint_s
        kind = outcome.kind
        if kind is OutcomeKind.OK:
            congestion = False
            self.shared_until = None
            # Latencies feed hedge delays, the choice of upstream, and whether a call
            # admitted late still has time for an attempt (``begin``).
            if self.deadline is not None or core.named or self.hedge is not None:
                latency = up.latency
                latency.record(now - attempt.started)
                if latency is not core.latency:  # a member of a set: the Gate's too
                    core.latency.record(now - attempt.started)
            if self.last_failed is up:
                self.last_failed = None
        elif kind is OutcomeKind.YIELD:
            congestion = True
            core.counters.yields += 1
            attempt.refused(now)
        elif kind is OutcomeKind.OVERLOADED:
            congestion = True
            core.counters.overloads += 1
        else:
            congestion = False
            self.shared_until = None
            core.counters.failures += 1
            self.last_failed = up
        if core.named:
            failure = kind is OutcomeKind.RETRYABLE or kind is OutcomeKind.FATAL
            up.note(ok=kind is OutcomeKind.OK, congestion=congestion, failure=failure)
        if congestion:
            # "Too much load" from any attempt: hedging would only add to it.
            self.hedging_off = True
        if outcome.reason == "cold_start" and core.rate is not None:
            core.rate.restart_ramp(now)
        if self.observer is NULL_OBSERVER:
            return None
        return AttemptDetails(
            gate=core.name,
            attempt=attempt.number,
            outcome=kind,
            reason=outcome.reason,
            hint_s=outcome.hint_s,
            duration_s=now - attempt.started,
        )

    def close(self, *, handed: bool) -> tuple[bool, Any]:
        """The call is over: give back what it still holds (its driver's ``finally``).

        A retry drawn from the budget (the Gate's or the fleet's) but never
        sent goes back to it, and so does a grant of the fleet's never entered
        in a ledger. A call that meant to hold its winner's slot but did not
        hand out its ``Lease`` (``handed``) gives the slot back. Returns
        whether a won value is left to discard, and the value.
        """
        core = self.core
        shared = core.shared
        held = None
        with core.lock:
            if self.withdrawn is not None:
                core.refund_draw(self.withdrawn)
                self.withdrawn = None
            if self.fleet_receipt is not None and shared is not None:
                policy = core.policy.budget
                args = (core.name, policy, self.fleet_receipt)
                shared.backlog.append(FleetOp("refund_retry", args))
                self.fleet_receipt = None
            granted, self.granted = self.granted, None
            back = None if granted is None else given_back(*granted)
            if back is not None and shared is not None:
                shared.backlog.append(back)
            if not handed:
                held, self.held = self.held, None
                self.lease = None
                if held is not None:
                    held.give_back(Signal.CANCELLED)
        core.after_lock()
        won = self.won
        if held is None or won is None:
            return False, None
        return True, won.value

    # -- retrying -----------------------------------------------------------

    def decide(self, outcome: Outcome, now: float) -> float:
        """Whether to try again after ``outcome`` and after how long. Stopping sets
        ``stop_error`` (and returns 0.0); so does nothing else."""
        with self.core.lock:
            return decide(self, outcome, now)

    def before_wait(self, outcome: Outcome) -> None:
        """A retry was decided and its wait begins: count it and report it."""
        core = self.core
        with core.lock:
            core.counters.retries += 1
        if self.observer is not NULL_OBSERVER:
            core.hook(
                self.observer.on_wait,
                WaitDetails(
                    gate=core.name,
                    next_attempt=self.attempts + 1,
                    wait_s=self.next_wait_s,
                    cause=outcome.kind,
                    hint_s=outcome.hint_s,
                ),
            )

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


def attempt_timed_out(core: GateCore, attempt: Attempt) -> Outcome | None:
    """The outcome of an attempt cut at its deadline: past its own timeout one that
    may be retried; past the call's, ``None`` (``CallState.end`` it with ``cut``,
    then raise ``deadline_error``)."""
    call_deadline = attempt.call_deadline
    if call_deadline is not None and attempt.deadline == call_deadline:
        return None
    attempt_s = core.policy.timeout.attempt_s
    return Outcome.retryable(
        AttemptTimeoutError(
            f"attempt {attempt.number} ran past {attempt_s} s", attempts=attempt.number
        )
    )

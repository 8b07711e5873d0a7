"""Stateful property tests of the Gate's parts: the window, the breaker, the retry budget.

Hypothesis drives each through random sequences of operations and checks
the invariants after every step.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from yieldgate import CircuitOpenError
from yieldgate.gate._breaker import Breaker, BreakerPolicy, BreakerState, BreakerTicket, Verdict
from yieldgate.gate._budget import _BUCKETS, RetryBudget, RetryBudgetPolicy
from yieldgate.gate._window import Permit, Signal, Window, WindowPolicy
from yieldgate.protocol import Priority

SETTINGS = settings(max_examples=60, stateful_step_count=40, deadline=None)


class WindowMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.policy = WindowPolicy(initial=2, min=1, max=8)
        self.window = Window(self.policy)
        self.held: list[Permit] = []

    @rule(priority=st.sampled_from(list(Priority)))
    def acquire(self, priority: Priority) -> None:
        free = self.window.inflight < self.window.limit
        permit = self.window.try_acquire(priority)
        # No waiters (nothing awaits here): a free slot is always granted, and
        # nothing is granted past the limit.
        assert (permit is not None) == free
        if permit is not None:
            self.held.append(permit)

    @precondition(lambda self: self.held)
    @rule(index=st.integers(min_value=0), signal=st.sampled_from(list(Signal)))
    def release(self, index: int, signal: Signal) -> None:
        permit = self.held.pop(index % len(self.held))
        self.window.release(permit, signal)
        self.window.release(permit, signal)  # idempotent: the second changes nothing

    @invariant()
    def bounds_hold(self) -> None:
        assert self.policy.min <= self.window.limit <= self.policy.max
        assert self.window.inflight == len(self.held)
        assert self.window.waiting == 0


class BreakerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.policy = BreakerPolicy(fail_max=3, reset_timeout_s=5.0, success_threshold=2)
        self.breaker = Breaker(self.policy, lambda: self.now)
        self.tickets: list[BreakerTicket] = []

    @rule()
    def acquire(self) -> None:
        state = self.breaker.state
        probes_out = sum(1 for t in self.tickets if t.probe)
        try:
            ticket = self.breaker.acquire()
        except CircuitOpenError:
            # Refused only when open and not yet due, or when a probe is already out.
            assert state is not BreakerState.CLOSED
            return
        self.tickets.append(ticket)
        if ticket.probe:
            # Never a second probe while one is out (stale tickets aside).
            assert probes_out == 0 or all(
                t.generation != ticket.generation for t in self.tickets[:-1] if t.probe
            )

    @precondition(lambda self: self.tickets)
    @rule(index=st.integers(min_value=0), verdict=st.sampled_from(list(Verdict)))
    def record(self, index: int, verdict: Verdict) -> None:
        ticket = self.tickets.pop(index % len(self.tickets))
        self.breaker.record(ticket, verdict)

    @rule(seconds=st.floats(min_value=0, max_value=8))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def at_most_one_live_probe(self) -> None:
        generation = self.breaker._generation
        live = [t for t in self.tickets if t.probe and t.generation == generation]
        assert len(live) <= 1
        if self.breaker.state is BreakerState.CLOSED:
            assert self.breaker.failures < self.policy.fail_max

    @invariant()
    def open_means_wait(self) -> None:
        if self.breaker.state is BreakerState.OPEN:
            assert 0 <= self.breaker.retry_after_s() <= self.policy.reset_timeout_s + 1e-9


class BudgetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.policy = RetryBudgetPolicy(ratio=0.2, min_per_s=0.5, window_s=10.0)
        self.budget = RetryBudget(self.policy, lambda: self.now)
        self.events: list[tuple[float, str]] = []

    @rule()
    def request(self) -> None:
        self.budget.deposit()
        self.events.append((self.now, "request"))

    @rule()
    def retry(self) -> None:
        if not self.budget.try_withdraw():
            return
        self.events.append((self.now, "retry"))
        # At the moment a retry is granted, the retries of the window so far (the
        # budget forgets in buckets, so count only what it surely still counts)
        # stay within the policy for the requests of the window.
        width = self.policy.window_s / _BUCKETS
        sure = [k for t, k in self.events if t > self.now - (self.policy.window_s - width)]
        window = [k for t, k in self.events if t > self.now - self.policy.window_s]
        allowed = self.policy.ratio * window.count("request") + (
            self.policy.min_per_s * self.policy.window_s
        )
        assert sure.count("retry") <= allowed

    @rule(seconds=st.floats(min_value=0, max_value=4))
    def wait(self, seconds: float) -> None:
        self.now += seconds

    @invariant()
    def allowance_is_bounded(self) -> None:
        # Never more than the policy could grant on a window full of the requests seen.
        requests = sum(1 for _, k in self.events if k == "request")
        ceiling = self.policy.ratio * requests + self.policy.min_per_s * self.policy.window_s
        assert self.budget.allowance() <= ceiling + 1e-9


TestWindow = WindowMachine.TestCase
TestWindow.settings = SETTINGS
TestBreaker = BreakerMachine.TestCase
TestBreaker.settings = SETTINGS
TestBudget = BudgetMachine.TestCase
TestBudget.settings = SETTINGS

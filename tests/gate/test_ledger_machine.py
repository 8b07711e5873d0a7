"""Issue 28, item 8: nothing held when nothing runs, as a stateful property of one Gate.

A hypothesis ``RuleBasedStateMachine`` builds one Gate per example, under a
policy it draws (a window of 1 to 4 slots, hedging, a rate cap, a quota, a
breaker that opens after 1 to 3 failures and resets soon, retries with tiny
backoffs, small timeouts, one upstream or two), and drives it through a few
rules. After every rule, with no call running, the Gate must hold nothing
that no live lease accounts for (``GateCore.audit() == []``: no window slot,
waiter, breaker probe, quota claim queued, pending or in flight, blind
attempt, retry-budget draw or fleet lease), the slots it keeps for leases
must be exactly those of the leases the machine still keeps, no caller may
be left waiting for a breaker's verdict, and every call it counted must have
ended (``calls == calls_ok + calls_failed``). While a rule runs, every
attempt sent must hold a window slot and a breaker ticket.

One rule, ``calls``, taken up to three times per example (each step is a
rule that runs calls: no step is spent on anything cheaper):

- first, maybe, release or drop a lease kept by an earlier rule, from outside
  any call, and let time pass (breakers reset, holds and quotas refill,
  leases lapse);
- then start one to six calls, concurrent, and run until all are over. Each
  is drawn: its priority, its API (``call``, ``hold``, ``call_and_hold``,
  ``map``; or a ``settle`` of a lease kept from before, mid-rule), its
  timeout (the policy's, its own, or none), when it starts, whether a cancel
  scope cuts it at some time, its classifier (one that sometimes raises or
  returns a non-``Outcome``), its cost, and what each of its attempts does:
  answer ok, a yield, an overload, a cold start, a retryable or fatal
  outcome, raise, report quota readings (a provider's small limits, so that
  the quota binds and claims queue) or its usage, sleep (past its attempt's
  timeout, or its call's), or hang until cancelled (or swallow the
  cancellation). What a call that holds does with its lease: release it
  (with a signal), work then release it, drop it (collected, possibly while
  the Gate's lock is held, as a collection inside the Gate's own code would),
  keep it for a later rule, or let it lapse (as a transport's response body
  does, possibly while a read is in progress).

The Gate's ``Instrumentation`` is drawn too: some of its hooks (``start_call``,
``on_attempt``, ``on_wait``, ``on_end``, ``on_window_change``,
``on_breaker_change``, the observer's ``scope`` on entry or exit) raise.
A call must end with its value or a ``YieldgateError`` (or the user's own
error: a classifier's, a ``hold`` body's, ``TypeError`` for a classifier
that returned no ``Outcome``); a hook's error never reaches it.

Three drivers, one machine each:

- asyncio, each rule on its own ``VirtualTimeLoop`` whose clock is the
  machine's (it starts where the last rule ended, so the Gate's clock never
  goes back); cancel scopes with random deadlines cut calls in every wait
  (window, quota queue, rate cap, breaker verdict, retry sleep) and in
  attempts;
- trio, the same on one ``MockClock(autojump_threshold=0)`` kept across rules;
- threads, the sync driver: each rule runs one to three threads, each making
  its calls one after another, in lockstep on a virtual clock
  (``tests/gate/lockstep.py``: one thread runs at a time, and time moves only
  when all wait), so that threads really wake each other and every run
  interleaves the same way. A ``KeyboardInterrupt`` is raised from a random
  wait of the rule (a retry sleep, a park in admission, an attempt's own
  sleep). Hedging does not apply; ``map_sync`` runs with one worker (two
  would race outside the lockstep).

Examples: 2,000 per driver by default; ``YIELDGATE_LEDGER_EXAMPLES=20000``
(say) runs more. Hypothesis prints the falsifying rules; its database keeps
them for the next run. A rule that runs 1,000 virtual seconds, or 10 real
ones (a wait that is over at once, again and again: virtual time then stands
still), fails too.

The end of the module has what the machine found, each as the smallest test
that shows it.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import math
import os
import random
import threading
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from trio.testing import MockClock

from tests.gate.holdings import held
from tests.gate.hooks import Hooks
from tests.gate.lockstep import Clock, Lockstep
from tests.gate.test_drivers import VirtualTimer
from tests.vtime import VirtualTimeLoop
from yieldgate import (
    BreakerPolicy,
    Cost,
    Gate,
    GatePolicy,
    HedgePolicy,
    Outcome,
    Priority,
    QuotaPolicy,
    RatePolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    WindowPolicy,
    YieldgateError,
    current_attempt,
)
from yieldgate.gate import (
    USE_POLICY,
    Lease,
    NullInstrumentation,
    QuotaReading,
    Signal,
    default_classify,
)

EXAMPLES = int(os.environ.get("YIELDGATE_LEDGER_EXAMPLES", "2000"))
SETTINGS = settings(
    max_examples=EXAMPLES,
    stateful_step_count=3,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# No rule may run longer than this (virtual seconds): every call has a deadline.
LIVENESS_S = 1000.0
# Nor longer than this in real time (a loop that never lets time pass).
STALL_S = 10.0


class ClassifierFailed(Exception):
    """What a broken classifier raises."""


class BodyFailed(Exception):
    """What the block of a ``hold`` raises."""


# -- what the calls do ------------------------------------------------------------------


@dataclass(frozen=True)
class Act:
    """What one attempt does: report, sleep, then answer."""

    kind: str  # ok, yield, overloaded, cold_start, retryable, fatal, raise_*, hang, swallow
    sleep_s: float = 0.0
    hint_s: float | None = None
    reading: tuple[str, int, int, float] | None = None  # resource, limit, remaining, reset
    used: int | None = None  # tokens it reports it used (an ok answer)


@dataclass(frozen=True)
class Plan:
    """One call of a rule (the fields its API does not use keep their defaults)."""

    api: str  # call hold call_and_hold map settle
    priority: Priority = Priority.NORMAL
    timeout: float | None = None  # None: the policy's; inf: none
    start_s: float = 0.0
    cancel_s: float | None = None  # a cancel scope's deadline, from the rule's start
    acts: tuple[Act, ...] = (Act("ok"),)
    classify: tuple[str, ...] | None = None  # per classification: fine, raise, plain
    cost: int | None = None
    fate: str = "release"  # what a call that holds does with its lease (a settle: the kept one)
    body_s: float = 0.0
    items: int = 1
    concurrency: int = 1
    return_exceptions: bool = False
    index: int = 0


class Attempts:
    """The attempt function of one call (or one item of a map) and its classifier."""

    def __init__(self, plan: Plan, wrong: list[BaseException]) -> None:
        self.plan = plan
        self.wrong = wrong  # what the attempts saw that must not be (the machine's)
        self.sent = 0
        self.classified = 0

    def act(self) -> Act:
        acts = self.plan.acts
        act = acts[min(self.sent, len(acts) - 1)]
        self.sent += 1
        info = current_attempt()
        assert info is not None
        ledger = info.attempt
        assert ledger is not None
        if ledger.permit is None or ledger.ticket is None:
            # Every attempt sent holds a window slot and a breaker ticket until it ends.
            self.wrong.append(
                AssertionError(
                    f"attempt {info.number} was sent with window permit {ledger.permit!r} "
                    f"and breaker ticket {ledger.ticket!r}"
                )
            )
        if act.reading is not None:
            resource, limit, remaining, reset_s = act.reading
            info.report_quota(
                (QuotaReading(f"up:{resource}", resource, limit, remaining, reset_s=reset_s),)
            )
        if act.used is not None:
            info.report_usage(Cost(1, act.used))
        return act

    def classifier(self) -> Callable[[Any, BaseException | None], Any] | None:
        modes = self.plan.classify
        if modes is None:
            return None

        def classify(value: Any, error: BaseException | None) -> Any:
            mode = modes[min(self.classified, len(modes) - 1)]
            self.classified += 1
            if mode == "raise":
                raise ClassifierFailed("the classifier is broken")
            if mode == "plain":
                return "not an Outcome"
            return default_classify(value, error)

        return classify


def answer(act: Act) -> Any:
    """What an attempt that is over answers (or raises)."""
    kind = act.kind
    if kind == "yield":
        return Outcome.yielded(act.hint_s, reason="rate_limited")
    if kind == "overloaded":
        return Outcome.overloaded(act.hint_s)
    if kind == "cold_start":
        return Outcome.overloaded(act.hint_s, reason="cold_start")
    if kind == "retryable":
        return Outcome.retryable(ConnectionResetError("reset"), hint_s=act.hint_s)
    if kind == "fatal":
        return Outcome.fatal(ValueError("bad request"))
    if kind == "raise_retryable":
        raise ConnectionResetError("reset")
    if kind == "raise_fatal":
        raise ValueError("bad request")
    return "ok"


# -- strategies -----------------------------------------------------------------------------

# Few draws per example: hypothesis's own cost per draw is most of the time an example
# takes, so the values drawn together are drawn as one choice (the simplest first).
SMALL_S = st.sampled_from([0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0])
ANSWERS = [
    ("ok", None),
    *(("yield", h) for h in (None, 0.0, 0.05, 0.2, 1.0, 3.0)),
    *(("overloaded", h) for h in (None, 0.05, 1.0)),
    ("cold_start", 0.2),
    *(("retryable", h) for h in (None, None, 0.05, 1.0)),
    ("fatal", None),
    ("raise_retryable", None),
    ("raise_retryable", None),
    ("raise_fatal", None),
    ("hang", None),
    ("swallow", None),
]
EXTRAS: list[tuple[str, Any] | None] = [
    *([None] * 40),
    *(
        ("reading", ("requests", limit, left, reset))
        for limit in (1, 2, 4)
        for left in range(limit + 1)
        for reset in (0.2, 2.0)
    ),
    *(("reading", ("tokens", limit, left, 1.0)) for limit in (2, 5, 20) for left in (0, limit)),
    *(("used", n) for n in range(6)),
]


def _act(answer: tuple[str, float | None], sleep_s: float, extra: tuple[str, Any] | None) -> Act:
    kind, hint_s = answer
    reading = extra[1] if extra is not None and extra[0] == "reading" else None
    used = extra[1] if extra is not None and extra[0] == "used" else None
    return Act(kind, sleep_s=sleep_s, hint_s=hint_s, reading=reading, used=used)


# Most attempts answer at once.
ACTS = st.one_of(
    st.just(Act("ok")),
    st.builds(
        _act,
        st.sampled_from(ANSWERS),
        st.sampled_from([0.0] * 5 + [0.01, 0.05, 0.1, 0.3, 1.0, 4.0]),
        st.sampled_from(EXTRAS),
    ),
)
FATES = st.sampled_from(
    [
        *("release", "release", "signal", "work", "work_drop", "drop", "drop_locked"),
        *("keep", "keep", "lapse", "lapse"),
    ]
)
STARTS = (0.0, 0.0, 0.0, 0.01, 0.1, 0.5)
CANCELS = (None, None, None, None, None, 0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.6, 1.0, 2.5)
WHO = [(p, c) for c in (None, None, None, 1, 3, 6) for p in Priority]


def _call(
    api: str,
    when: tuple[float, float | None],
    who: tuple[Priority, int | None],
    timeout: float | None,
    acts: list[Act],
    classify: tuple[str, ...] | None,
    **more: Any,
) -> Plan:
    start_s, cancel_s = when
    priority, cost = who
    return Plan(
        api,
        priority=priority,
        timeout=timeout,
        start_s=start_s,
        cancel_s=cancel_s,
        acts=tuple(acts),
        classify=classify,
        cost=cost,
        **more,
    )


CALL = {
    # start, and when a cancel scope cuts the call (None: never)
    "when": st.sampled_from([(s, c) for c in CANCELS for s in STARTS]),
    "who": st.sampled_from(WHO),
    # None: the policy's; inf: none at all (then cancelled from outside)
    "timeout": st.sampled_from([None, None, None, 0.3, 1.0, 3.0, math.inf]),
    "acts": st.lists(ACTS, min_size=1, max_size=3),
    "classify": st.sampled_from(
        [None] * 12
        + [("raise",), ("plain",), ("fine", "raise"), ("fine", "plain"), ("raise", "fine")]
    ),
}
CALLS = st.builds(_call, st.just("call"), **CALL)
PLANS = st.one_of(
    CALLS,
    CALLS,
    CALLS,
    st.builds(
        _call, st.just("hold"), fate=st.sampled_from(["release", "signal"]), body_s=SMALL_S, **CALL
    ),
    st.builds(
        _call, st.just("call_and_hold"), fate=FATES, body_s=SMALL_S, index=st.integers(0, 3), **CALL
    ),
    st.builds(
        _call,
        st.just("map"),
        items=st.integers(1, 3),
        concurrency=st.integers(1, 3),
        return_exceptions=st.booleans(),
        **CALL,
    ),
    st.builds(
        Plan,
        api=st.just("settle"),
        start_s=st.sampled_from(STARTS),
        fate=st.sampled_from(["release", "signal", "drop", "drop_locked"]),
        index=st.integers(0, 3),
    ),
)
HOOKS = [
    "start_call",
    "on_attempt",
    "on_wait",
    "on_end",
    "on_window_change",
    "on_breaker_change",
    "scope_enter",
    "scope_exit",
]
# Which hooks raise: none, one, two, or all of them.
BROKEN = [
    *([frozenset()] * 8),
    *(frozenset([hook]) for hook in HOOKS),
    *(frozenset(pair) for pair in itertools.combinations(HOOKS, 2)),
    frozenset(HOOKS),
]


WINDOWS = [
    *(WindowPolicy.fixed(size) for size in (1, 2, 3, 4)),
    *(WindowPolicy(initial=i, min=1, max=m) for m in (1, 2, 3, 4) for i in range(1, m + 1)),
]
HEDGES: list[HedgePolicy | None] = [
    *([None] * 9),
    *(HedgePolicy.fixed(d, max_hedges=h) for h in (1, 2) for d in (0.01, 0.05, 0.2)),
    # the delay a quantile of the latencies seen
    *(
        HedgePolicy(max_hedges=h, initial_delay_s=0.05, quantile=0.5, min_samples=2, samples=4)
        for h in (1, 2)
    ),
]
RATES: list[RatePolicy | None] = [
    *([None] * 12),
    *(
        RatePolicy(per_s=per_s, burst=burst, ramp_from_per_s=ramp, ramp_s=1.0)
        for per_s in (2.0, 10.0, 50.0)
        for burst in (1, 2)
        for ramp in (None, 1.0)
    ),
]
QUOTAS = [
    *([QuotaPolicy()] * 6),
    *(
        QuotaPolicy(requests_per_minute=rpm, tokens_per_minute=tpm)
        for rpm in (6.0, 30.0)
        for tpm in (None, 10.0, 60.0)
    ),
]
BREAKERS = [
    BreakerPolicy(fail_max=n, reset_timeout_s=reset, success_threshold=k)
    for n in (1, 2, 3)
    for reset in (0.1, 0.5, 2.0)
    for k in (1, 2)
]
RETRIES = [
    RetryPolicy(
        max_attempts=attempts,
        max_yields=yields,
        base_s=base_s,
        max_backoff_s=0.2,
        max_hint_s=5.0,
        share_hints=share,
    )
    for attempts in (1, 2, 3, 4)
    for yields in (1, 2, 4)
    for base_s in (0.001, 0.01, 0.05)
    for share in (True, False)
]
BUDGETS = [RetryBudgetPolicy(), RetryBudgetPolicy(ratio=0.1, min_per_s=0.1, window_s=2.0)]
TIMEOUTS = [
    TimeoutPolicy(attempt_s=attempt_s, total_s=total_s)
    for total_s in (0.5, 2.0, 6.0)
    for attempt_s in (None, 0.15, 0.6)
]


def policies(*, hedging: bool) -> st.SearchStrategy[GatePolicy]:
    """A policy: each part drawn as one choice (few draws per example)."""
    return st.builds(
        GatePolicy,
        window=st.sampled_from(WINDOWS),
        hedge=st.sampled_from(HEDGES) if hedging else st.none(),
        rate=st.sampled_from(RATES),
        quota=st.sampled_from(QUOTAS),
        breaker=st.sampled_from(BREAKERS),
        retry=st.sampled_from(RETRIES),
        budget=st.sampled_from(BUDGETS),
        timeout=st.sampled_from(TIMEOUTS),
    )


# -- instrumentation that breaks --------------------------------------------------------------


def flaky(broken: frozenset[str], every: int) -> Hooks:
    """Hooks each named in ``broken`` raising ``HookFailed`` every ``every``-th time."""
    return Hooks(lambda hook, n: hook in broken and n % every == 0)


# -- the machine ------------------------------------------------------------------------------


class LedgerMachine(RuleBasedStateMachine):
    """One Gate, driven by rules of calls; what every driver shares (see the module
    docstring). A driver's subclass runs a rule's calls (``run_calls``), says what
    its clock reads, and how time passes between rules (``pass_time``)."""

    hedging = True
    cancellable = True  # a call may be cancelled from outside (else: it has a deadline)

    def __init__(self) -> None:
        super().__init__()
        self.gate: Gate | None = None
        self.kept: list[Lease] = []
        self.dropped: list[weakref.ref[Lease]] = []
        self.unexpected: list[BaseException] = []

    # -- what a driver gives --------------------------------------------------------

    def clock(self) -> Callable[[], float]:
        """The Gate's clock: the driver's virtual time (never the machine's own method,
        so that a Gate dropped with its machine is freed at once, not by a collection)."""
        raise NotImplementedError

    def pass_time(self, seconds: float) -> None:
        raise NotImplementedError

    def run_calls(self, plans: list[Plan], interrupt_at: int | None) -> None:
        raise NotImplementedError

    # -- rules ------------------------------------------------------------------------

    @initialize(
        data=st.data(),
        broken=st.sampled_from(BROKEN),
        every=st.integers(1, 3),
        upstreams=st.sampled_from([None, ["a", "b"]]),
        seed=st.integers(0, 3),
        since_checkpoint=st.integers(0, 127),
    )
    def build(
        self,
        data: st.DataObject,
        broken: frozenset[str],
        every: int,
        upstreams: list[str] | None,
        seed: int,
        since_checkpoint: int,
    ) -> None:
        policy = data.draw(policies(hedging=self.hedging), label="policy")
        self.gate = Gate(
            policy,
            name="machine",
            instrumentation=flaky(broken, every),
            rng=random.Random(seed),
            upstreams=upstreams,
            clock=self.clock(),
        )
        # Where the async driver's periodic checkpoint falls (every 128th call).
        self.gate._core.since_checkpoint = since_checkpoint
        self.setup_gate(self.gate)

    def setup_gate(self, gate: Gate) -> None:
        """What a driver adds to the Gate (the sync driver's timer)."""

    @rule(
        settle=st.one_of(
            st.none(),
            st.tuples(
                st.integers(0, 3), st.sampled_from(["release", "signal", "drop", "drop_locked"])
            ),
        ),
        pause_s=st.sampled_from([0.0, 0.0, 0.0, 0.3, 1.0, 5.0]),
        plans=st.lists(PLANS, min_size=1, max_size=6),
        interrupt_at=st.one_of(st.none(), st.integers(1, 12)),
    )
    def calls(
        self,
        settle: tuple[int, str] | None,
        pause_s: float,
        plans: list[Plan],
        interrupt_at: int | None,
    ) -> None:
        """Release or drop a lease kept by an earlier rule (``settle``, from outside any
        call), let ``pause_s`` pass (breakers reset, holds and quotas refill, leases
        lapse), then run ``plans`` until all are over."""
        if settle is not None:
            self.settle_kept(*settle)
        self.pass_time(pause_s)
        self.run_calls(plans, interrupt_at)
        self.check_ended()

    # -- the invariant ---------------------------------------------------------------------

    @invariant()
    def nothing_held_when_nothing_runs(self) -> None:
        gate = self.gate
        if gate is None:
            return
        core = gate._core
        if any(ref() is not None for ref in self.dropped):
            gc.collect()
        alive = [ref for ref in self.dropped if ref() is not None]
        self.dropped = []
        assert not alive, "a dropped lease is still alive (kept by the Gate?)"
        problems = core.audit()
        assert problems == [], problems
        for up in core.upstreams:  # a place in the breaker's line, which audit does not list
            waiting = len(up.breaker._verdict_waiters)
            assert not waiting, f"{up.name}: {waiting} waiter(s) left for the breaker's verdict"
        live = {lease._held for lease in self.kept if not lease.released}
        assert core.held == live, (
            f"the Gate keeps {len(core.held)} held slot(s), the machine {len(live)} live lease(s)"
        )
        stats = gate.statistics()
        assert stats.calls == stats.calls_ok + stats.calls_failed, (
            f"{stats.calls} calls, {stats.calls_ok} ok, {stats.calls_failed} failed"
        )

    def teardown(self) -> None:
        for lease in self.kept:
            lease.release()
        self.kept.clear()

    # -- shared by the drivers ---------------------------------------------------------------

    def call_kwargs(self, plan: Plan, attempts: Attempts) -> dict[str, Any]:
        timeout: Any = plan.timeout
        if timeout is None or (math.isinf(timeout) and not self.cancellable):
            timeout = USE_POLICY
        elif math.isinf(timeout):
            timeout = None  # a cancel scope ends it (``AsyncMachine._one``)
        return {
            "priority": plan.priority,
            "timeout": timeout,
            "classify": attempts.classifier(),
            "cost": plan.cost,
        }

    def ended_with(self, error: BaseException) -> None:
        """A call raised ``error``: a ``YieldgateError`` or the user's own, nothing else."""
        if isinstance(error, YieldgateError | ClassifierFailed | BodyFailed):
            return
        if isinstance(error, TypeError) and "must return an Outcome" in str(error):
            return
        self.unexpected.append(error)

    def check_ended(self) -> None:
        if self.unexpected:
            error = self.unexpected[0]
            shown = "".join(traceback.format_exception(error))
            raise AssertionError(f"a call went wrong: {error!r}\n{shown}")

    def settle_kept(self, index: int, fate: str) -> None:
        if self.kept:
            box = [self.kept.pop(index % len(self.kept))]
            self.dropped.append(weakref.ref(box[0]))
            self.dispose(box, fate, index)

    def dispose(self, box: list[Lease], fate: str, index: int) -> None:
        """Release the lease in ``box`` (with a signal) or drop it, the box holding the
        only reference (while the Gate's lock is held, for ``drop_locked``: its
        finalizer then leaves the slot to the next caller that looks)."""
        if fate not in ("signal", "drop", "drop_locked"):
            box.pop().release()
        elif fate == "signal":
            box.pop().release(list(Signal)[index % len(Signal)])
        elif fate == "drop":
            box.clear()
        else:
            assert self.gate is not None
            with self.gate._core.lock:
                box.clear()

    def handed(self, box: list[Lease], fate: str, body_s: float) -> bool:
        """A call handed out the lease in ``box``: keep it for a later rule (``keep``,
        ``lapse``: True), or watch that it is collected once the machine lets go of it."""
        lease = box[0]
        if fate == "lapse":  # as a transport leaves a response body to be read later
            lease.lapse_after(max(body_s, 0.01))
            lease.report_usage(Cost(1, 2))
            if body_s > 0.5:
                lease.touch(reading=True)  # a read in progress: it never lapses now
        elif fate != "keep":
            self.dropped.append(weakref.ref(lease))
            return False
        self.kept.append(box.pop())
        return True


# -- asyncio and trio ---------------------------------------------------------------------------


class AsyncMachine(LedgerMachine):
    """A rule's calls as tasks of one task group, on a fresh event loop per rule."""

    backend = "asyncio"

    def run_calls(self, plans: list[Plan], interrupt_at: int | None) -> None:
        anyio.run(self._calls, plans, backend=self.backend, backend_options=self.options())

    def options(self) -> dict[str, Any]:
        raise NotImplementedError

    async def _calls(self, plans: list[Plan]) -> None:
        start = anyio.current_time()
        token = anyio.lowlevel.current_token()
        stalled = threading.Event()
        with anyio.move_on_after(LIVENESS_S) as guard:

            def stall() -> None:
                stalled.set()
                with contextlib.suppress(Exception):  # over already
                    anyio.from_thread.run_sync(guard.cancel, token=token)

            watchdog = threading.Timer(STALL_S, stall)
            watchdog.start()
            try:
                async with anyio.create_task_group() as tg:
                    for plan in plans:
                        tg.start_soon(self._one, plan, start)
            finally:
                watchdog.cancel()
        # Virtual time stands still while a task never blocks: a wait that is over at once.
        assert not stalled.is_set(), f"calls still running after {STALL_S} real seconds"
        assert not guard.cancelled_caught, f"calls still running after {LIVENESS_S} s"

    async def _one(self, plan: Plan, start: float) -> None:
        cancel_s = plan.cancel_s
        if cancel_s is None and plan.timeout is not None and math.isinf(plan.timeout):
            cancel_s = 3.0  # a call without a deadline is cancelled from outside
        deadline = math.inf if cancel_s is None else start + cancel_s
        with anyio.CancelScope(deadline=deadline):
            if plan.start_s:
                await anyio.sleep(plan.start_s)
            try:
                await self._invoke(plan)
            except Exception as exc:
                self.ended_with(exc)

    async def _invoke(self, plan: Plan) -> None:
        gate = self.gate
        assert gate is not None
        if plan.api == "settle":
            self.settle_kept(plan.index, plan.fate)
            return
        attempts = Attempts(plan, self.unexpected)
        kwargs = self.call_kwargs(plan, attempts)
        if plan.api == "call":
            await gate.call(self._attempt, attempts, **kwargs)
        elif plan.api == "hold":
            async with gate.hold(self._attempt, attempts, **kwargs):
                await anyio.sleep(plan.body_s)
                if plan.fate == "signal":
                    raise BodyFailed
        elif plan.api == "call_and_hold":
            box = [(await gate.call_and_hold(self._attempt, attempts, **kwargs))[1]]
            if self.handed(box, plan.fate, plan.body_s):
                return
            if plan.fate == "work":
                try:
                    await anyio.sleep(plan.body_s)
                finally:
                    box.pop().release()
            elif plan.fate == "work_drop":
                await anyio.sleep(plan.body_s)  # cancelled here: the lease is dropped
                box.pop().release()
            else:
                self.dispose(box, plan.fate, plan.index)
        else:
            items = [Attempts(plan, self.unexpected) for _ in range(plan.items)]
            await gate.map(
                self._attempt,
                items,
                concurrency=plan.concurrency,
                return_exceptions=plan.return_exceptions,
                **kwargs,
            )

    async def _attempt(self, attempts: Attempts) -> Any:
        act = attempts.act()
        if act.kind == "hang":
            await anyio.sleep_forever()
        if act.kind == "swallow":
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                return "swallowed its cancellation"
        if act.sleep_s:
            await anyio.sleep(act.sleep_s)
        return answer(act)


class CarriedLoop(VirtualTimeLoop):
    """A ``VirtualTimeLoop`` whose time is the machine's: it starts where the last
    rule's loop left it."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        super().__init__()

    def time(self) -> float:
        return self._clock.now

    def advance(self, seconds: float) -> None:
        self._clock.now += seconds


class AsyncioMachine(AsyncMachine):
    backend = "asyncio"

    def __init__(self) -> None:
        self.time = Clock()
        super().__init__()

    def clock(self) -> Callable[[], float]:
        return self.time

    def pass_time(self, seconds: float) -> None:
        self.time.now += seconds

    def options(self) -> dict[str, Any]:
        return {"loop_factory": lambda: CarriedLoop(self.time)}


class TrioMachine(AsyncMachine):
    backend = "trio"

    def __init__(self) -> None:
        self.mock = MockClock(autojump_threshold=0)
        super().__init__()

    def clock(self) -> Callable[[], float]:
        return self.mock.current_time

    def pass_time(self, seconds: float) -> None:
        self.mock.jump(seconds)

    def options(self) -> dict[str, Any]:
        return {"clock": self.mock}


# -- threads ----------------------------------------------------------------------------------


class SyncMachine(LedgerMachine):
    """A rule's calls split among one to three threads in lockstep (see the module
    docstring), each making its calls in turn."""

    hedging = False  # the sync driver ignores it
    cancellable = False

    def __init__(self) -> None:
        self.time = Clock()
        self.lockstep = Lockstep(self.time)
        super().__init__()

    def clock(self) -> Callable[[], float]:
        return self.time

    def pass_time(self, seconds: float) -> None:
        self.time.now += seconds

    def setup_gate(self, gate: Gate) -> None:
        gate._timer = self.lockstep

    def run_calls(self, plans: list[Plan], interrupt_at: int | None) -> None:
        lanes = min(3, len(plans))
        bodies = [self._body(plans[i::lanes]) for i in range(lanes)]
        self.lockstep.run(bodies, interrupt_at=interrupt_at)
        assert not self.lockstep.stuck, "every thread waited with nothing to wake it"

    def _body(self, plans: list[Plan]) -> Callable[[], None]:
        def body() -> None:
            start = self.time.now
            for plan in plans:
                ahead = start + plan.start_s - self.time.now
                try:
                    if ahead > 0:
                        self.lockstep.sleep(ahead)
                    self._invoke(plan)
                except KeyboardInterrupt:
                    pass  # the injected Ctrl-C: the call is over
                except Exception as exc:
                    self.ended_with(exc)
                except BaseException as exc:
                    self.unexpected.append(exc)

        return body

    def _invoke(self, plan: Plan) -> None:
        gate = self.gate
        assert gate is not None
        if plan.api == "settle":
            self.settle_kept(plan.index, plan.fate)
            return
        attempts = Attempts(plan, self.unexpected)
        kwargs = self.call_kwargs(plan, attempts)
        if plan.api == "call":
            gate.call_sync(self._attempt, attempts, **kwargs)
        elif plan.api == "hold":
            with gate.hold_sync(self._attempt, attempts, **kwargs):
                self.lockstep.sleep(plan.body_s)
                if plan.fate == "signal":
                    raise BodyFailed
        elif plan.api == "call_and_hold":
            box = [gate.call_and_hold_sync(self._attempt, attempts, **kwargs)[1]]
            if self.handed(box, plan.fate, plan.body_s):
                return
            if plan.fate == "work":
                try:
                    self.lockstep.sleep(plan.body_s)
                finally:
                    box.pop().release()
            elif plan.fate == "work_drop":
                self.lockstep.sleep(plan.body_s)  # interrupted here: the lease is dropped
                box.pop().release()
            else:
                self.dispose(box, plan.fate, plan.index)
        else:
            items = [Attempts(plan, self.unexpected) for _ in range(plan.items)]
            gate.map_sync(
                self._attempt,
                items,
                concurrency=1,
                return_exceptions=plan.return_exceptions,
                **kwargs,
            )

    def _attempt(self, attempts: Attempts) -> Any:
        act = attempts.act()
        if act.kind in ("hang", "swallow"):
            # A thread is not cancelled: a transport gives up when its attempt's time is up.
            info = current_attempt()
            assert info is not None
            left = info.remaining_s()
            self.lockstep.sleep(30.0 if left is None else left)
            raise TimeoutError("the attempt's time is up")
        if act.sleep_s:
            self.lockstep.sleep(act.sleep_s)
        return answer(act)


# -- the tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "machine",
    [
        pytest.param(AsyncioMachine, id="asyncio"),
        pytest.param(TrioMachine, id="trio"),
        pytest.param(SyncMachine, id="sync"),
    ],
)
def test_nothing_is_held_when_nothing_runs(machine: type[LedgerMachine]) -> None:
    logger = logging.getLogger("yieldgate")
    disabled, logger.disabled = logger.disabled, True  # the broken hooks' thousands of logs
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        logger.disabled = disabled


def test_the_lockstep_wakes_a_thread_from_another_and_moves_time_only_when_all_wait() -> None:
    clock = Clock(10.0)
    lockstep = Lockstep(clock)
    event = threading.Event()
    seen: list[tuple[str, float]] = []

    def waiter() -> None:
        woken = lockstep.wait(event, 5.0)
        seen.append((f"woken {woken}", round(clock.now, 3)))

    def setter() -> None:
        lockstep.sleep(1.0)
        seen.append(("set", round(clock.now, 3)))
        event.set()
        lockstep.sleep(0.5)

    lockstep.run([waiter, setter])
    assert seen == [("set", 11.0), ("woken True", 11.0)]
    assert not lockstep.stuck


# -- what the machine found: each as the smallest test that shows it -------------------------


class SpinGuard(VirtualTimer):
    """The sync driver's virtual timer, failing once the Gate has waited ``limit`` times
    (a wait that ends at once, again and again, never lets virtual time pass)."""

    def __init__(self, t: float = 0.0, limit: int = 100) -> None:
        super().__init__()
        self.t = t
        self.limit = limit
        self.waits = 0

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        self.waits += 1
        if self.waits > self.limit:
            raise AssertionError(f"the Gate waited {self.waits} times, at t={self.t}")
        return super().wait(event, seconds)


@pytest.mark.anyio
async def test_a_call_that_waited_for_the_quota_still_needs_a_window_slot() -> None:
    """An attempt whose claim queued for the quota was sent without a window slot
    (``admit``: ``paced or (yield from _window(...))`` skips the window once paced):
    a window of one then let a second attempt run beside the first."""
    g = Gate(
        GatePolicy(
            window=WindowPolicy.fixed(1),
            quota=QuotaPolicy(requests_per_minute=1, learn=False),
            timeout=TimeoutPolicy(attempt_s=None, total_s=None),
        ),
        instrumentation=NullInstrumentation(),
    )
    running = 0
    most = 0

    async def attempt(seconds: float) -> str:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await anyio.sleep(seconds)
        running -= 1
        return "ok"

    async with anyio.create_task_group() as tg:
        tg.start_soon(g.call, attempt, 120.0)  # the quota's one request, for two minutes
        await anyio.sleep(1.0)
        tg.start_soon(g.call, attempt, 1.0)  # queues for the quota until about 60 s
    assert most == 1, f"{most} attempts ran at once through a window of one"
    assert held(g) == []


def test_a_holding_call_that_waited_for_the_quota_holds_a_slot_and_gives_it_back() -> None:
    """The same, as the ledger machine met it: the call's ``Lease`` held no slot, and its
    ``Held`` (permit ``None``) stayed in ``GateCore.held`` for ever."""
    timer = SpinGuard()
    g = Gate(
        GatePolicy(
            window=WindowPolicy.fixed(1), quota=QuotaPolicy(requests_per_minute=1, learn=False)
        ),
        instrumentation=NullInstrumentation(),
        clock=timer.now,
    )
    g._timer = timer
    g.call_sync(lambda: "first")
    value, lease = g.call_and_hold_sync(lambda: "held", timeout=120)  # waits for the quota
    assert (value, round(timer.t)) == ("held", 60)
    assert g.statistics().window.inflight == 1, "the lease holds no window slot"
    lease.release()
    assert g._core.held == set()
    assert held(g) == []


def test_a_lease_lapses_at_the_time_the_gate_wakes_up_for_it() -> None:
    """A lease with an idle bound is looked at again at ``touched + idle_s``, but
    ``Held.lapsed`` asked ``now - touched >= idle_s``, which rounding can make false at
    that very time: the waiter parked until ``now`` again and again. On a real clock it
    spins until the clock ticks; on trio's ``MockClock`` (or any clock that stands still
    while a task runs) for ever. Touched at 0.08 s, idle 0.1 s: 0.08 + 0.1 - 0.08 < 0.1."""
    timer = SpinGuard(t=0.08)
    g = Gate(
        GatePolicy(window=WindowPolicy.fixed(1)),
        instrumentation=NullInstrumentation(),
        clock=timer.now,
    )
    g._timer = timer
    _, lease = g.call_and_hold_sync(lambda: "held")
    lease.lapse_after(0.1)
    assert g.call_sync(lambda: "next", timeout=5) == "next"  # the slot lapsed: it may go
    assert lease.released
    assert timer.t == pytest.approx(0.18)
    assert held(g) == []

"""The Governor: slots, immediate yields, honest hints, priorities, cold start."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from yieldgate.protocol import Priority, YieldReason
from yieldgate.server.governor import (
    AdmissionRequest,
    Governor,
    GovernorConfig,
    PriorityPolicy,
    Rejection,
    Slot,
    Yield,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000.0


def make(clock: FakeClock, **kw: object) -> Governor:
    return Governor(GovernorConfig(**kw), clock=clock)  # type: ignore[arg-type]


def admit(gov: Governor, priority: Priority = Priority.NORMAL, **kw: object) -> Slot:
    slot = gov.try_acquire(priority, **kw)  # type: ignore[arg-type]
    assert isinstance(slot, Slot), slot
    return slot


def refuse(gov: Governor, priority: Priority = Priority.NORMAL) -> Yield:
    decision = gov.try_acquire(priority)
    assert isinstance(decision, Yield), decision
    return decision


def test_admits_up_to_max_inflight_then_yields_at_once() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=3)
    slots = [admit(gov) for _ in range(3)]
    y = refuse(gov)
    assert (y.reason, y.inflight, y.max_inflight) == (YieldReason.SATURATED, 3, 3)
    assert gov.inflight == 3
    slots[0].release("executed")
    admit(gov)
    s = gov.stats()
    assert (s.admitted_total, s.executed_total, s.yielded_total, s.inflight) == (4, 1, 1, 3)


def test_hint_is_the_earliest_expected_completion() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=2, initial_exec_ms=1000)
    admit(gov)
    clock.advance_ms(300)
    admit(gov)
    clock.advance_ms(100)
    # In flight for 400 ms and 100 ms with an expected 1000 ms each: 600 ms to the first.
    assert refuse(gov).retry_hint_ms == 600
    clock.advance_ms(250)
    assert refuse(gov).retry_hint_ms == 350


def test_hint_follows_measured_execution_times() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, initial_exec_ms=1000, ewma_alpha=1.0)
    slot = admit(gov)
    clock.advance_ms(200)
    slot.release("executed")
    assert gov.stats().exec_ms_ewma == pytest.approx(200)
    admit(gov)
    clock.advance_ms(50)
    assert refuse(gov).retry_hint_ms == 150


def test_hint_uses_the_backends_own_estimate_per_slot() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=2, initial_exec_ms=1000)
    admit(gov, expected_ms=80)
    admit(gov)
    clock.advance_ms(30)
    assert refuse(gov).retry_hint_ms == 50


def test_late_work_gets_a_residual_not_zero() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, initial_exec_ms=1000)
    admit(gov)
    clock.advance_ms(5000)
    hint = refuse(gov).retry_hint_ms
    assert hint == 100  # a tenth of the mean: it is late, likely to end soon, not instantly


def test_hints_are_clamped() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, initial_exec_ms=10_000_000, max_hint_ms=60_000)
    admit(gov)
    assert refuse(gov).retry_hint_ms == 60_000
    gov2 = make(clock, max_inflight=1, initial_exec_ms=1.0, min_hint_ms=25)
    admit(gov2)
    assert refuse(gov2).retry_hint_ms == 25


def test_hint_is_never_a_constant() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, initial_exec_ms=500)
    admit(gov)
    hints = []
    for _ in range(4):
        hints.append(refuse(gov).retry_hint_ms)
        clock.advance_ms(100)
    assert hints == [500, 400, 300, 200]


def test_priority_reservations() -> None:
    clock = FakeClock()
    policy = PriorityPolicy(reserved_for_high=1, reserved_for_normal=1)
    gov = make(clock, max_inflight=4, priority=policy)
    admit(gov, Priority.LOW)
    admit(gov, Priority.LOW)
    refuse(gov, Priority.LOW)  # low may hold at most 2
    admit(gov, Priority.NORMAL)
    refuse(gov, Priority.NORMAL)  # normal may hold at most 3
    admit(gov, Priority.HIGH)
    refuse(gov, Priority.HIGH)
    assert gov.inflight == 4


def test_low_priority_hint_waits_for_enough_slots_to_free() -> None:
    clock = FakeClock()
    policy = PriorityPolicy(reserved_for_high=2)
    gov = make(clock, max_inflight=4, priority=policy, initial_exec_ms=1000)
    for _ in range(2):
        admit(gov, Priority.NORMAL)
        clock.advance_ms(100)
    admit(gov, Priority.HIGH)
    clock.advance_ms(100)
    # Remaining: 700, 800, 900 ms. Normal may hold 2: it needs 2 slots to free.
    assert refuse(gov, Priority.NORMAL).retry_hint_ms == 800
    assert isinstance(gov.try_acquire(Priority.HIGH), Slot)


def test_every_priority_keeps_one_slot_under_a_small_capacity() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=4, priority=PriorityPolicy(reserved_for_high=2))
    gov.set_capacity(1)
    admit(gov, Priority.LOW)
    refuse(gov, Priority.HIGH)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"max_inflight": 0}, "max_inflight"),
        ({"max_inflight": 2, "priority": PriorityPolicy(reserved_for_high=2)}, "reserved"),
        ({"initial_exec_ms": 0}, "initial_exec_ms"),
        ({"ewma_alpha": 0}, "ewma_alpha"),
        ({"min_hint_ms": 5, "max_hint_ms": 1}, "min_hint_ms"),
    ],
)
def test_config_validation(kw: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GovernorConfig(**kw)  # type: ignore[arg-type]


def test_policy_rejects_negative_reservations() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        PriorityPolicy(reserved_for_high=-1)


def test_capacity_ramp() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=4)
    gov.set_capacity(2)
    admit(gov)
    admit(gov)
    assert refuse(gov).max_inflight == 2  # the limit in force, not the configured one
    gov.set_capacity(3)
    admit(gov)
    with pytest.raises(ValueError, match="capacity"):
        gov.set_capacity(5)
    with pytest.raises(ValueError, match="capacity"):
        gov.set_capacity(0)


def test_lowering_capacity_below_inflight_keeps_admitted_work() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=4, initial_exec_ms=1000)
    for i in range(4):
        admit(gov)
        clock.advance_ms(100 * (i + 1))
    gov.set_capacity(1)
    assert gov.inflight == 4
    # 4 slots must free before one is usable; the hint is the last of them.
    assert refuse(gov).retry_hint_ms == 1000 - 400


def test_cold_start_yields_with_a_countdown() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=2)
    gov.begin_cold_start(3.0)
    assert gov.is_cold
    y = refuse(gov, Priority.HIGH)
    assert (y.reason, y.retry_hint_ms) == (YieldReason.COLD_START, 3000)
    clock.advance_ms(2500)
    assert refuse(gov).retry_hint_ms == 500
    clock.advance_ms(1000)
    # Late: come back after a tenth of the estimate, not immediately.
    assert refuse(gov).retry_hint_ms == 300
    gov.mark_warm()
    admit(gov)
    assert gov.stats().yielded_by_reason == {"cold_start": 3}


def test_admission_hook_can_reject_early() -> None:
    clock = FakeClock()
    seen: list[AdmissionRequest] = []

    def hook(req: AdmissionRequest) -> Rejection | None:
        seen.append(req)
        if req.priority is Priority.LOW and req.inflight >= 1:
            return Rejection(retry_hint_ms=1234)
        return None

    gov = Governor(GovernorConfig(max_inflight=4), admission_hook=hook, clock=clock)
    admit(gov, Priority.LOW, body="abc", params={"max_tokens": 5})
    y = refuse(gov, Priority.LOW)
    assert (y.reason, y.retry_hint_ms) == (YieldReason.SLO, 1234)
    admit(gov, Priority.HIGH)
    assert seen[0].body == "abc"
    assert seen[0].params == {"max_tokens": 5}
    assert (seen[1].inflight, seen[1].capacity) == (1, 4)
    assert gov.stats().yielded_by_reason == {"slo": 1}


def test_hook_is_not_consulted_when_saturated() -> None:
    clock = FakeClock()
    calls = []
    gov = Governor(
        GovernorConfig(max_inflight=1),
        admission_hook=lambda r: calls.append(r),  # type: ignore[func-returns-value]
        clock=clock,
    )
    admit(gov)
    assert refuse(gov).reason is YieldReason.SATURATED
    assert len(calls) == 1


def test_release_outcomes_and_idempotence() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=3, initial_exec_ms=1000, ewma_alpha=1.0)
    a, b, c = admit(gov), admit(gov), admit(gov)
    clock.advance_ms(40)
    assert a.release("executed") == pytest.approx(40)
    assert a.release("cancelled") == 0.0  # second release is a no-op
    b.release("failed")
    c.release("cancelled")
    s = gov.stats()
    assert (s.executed_total, s.failed_total, s.cancelled_total, s.inflight) == (1, 1, 1, 0)
    assert s.inflight_peak == 3


def test_cancelled_work_is_not_measured() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, ewma_alpha=1.0)
    slot = admit(gov)
    clock.advance_ms(5)
    slot.release("cancelled")
    assert gov.stats().exec_ms_ewma is None


def test_errors_are_counted_by_code() -> None:
    gov = Governor()
    gov.record_error("bad_frame")
    gov.record_error("bad_frame")
    gov.record_error("unauthorized")
    s = gov.stats()
    assert s.errors_total == 3
    assert s.as_dict()["errors_by_code"] == {"bad_frame": 2, "unauthorized": 1}


class GovernorMachine(RuleBasedStateMachine):
    """Random admissions, releases, capacity changes and time: the promises always hold."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.max = 5
        self.gov = Governor(
            GovernorConfig(
                max_inflight=self.max,
                priority=PriorityPolicy(reserved_for_high=1, reserved_for_normal=1),
            ),
            clock=self.clock,
        )
        self.slots: list[Slot] = []
        self.yields = 0
        self.last = self.gov.stats()

    @rule(priority=st.sampled_from(list(Priority)))
    def submit(self, priority: Priority) -> None:
        before = self.gov.inflight
        decision = self.gov.try_acquire(priority)
        limit = self.gov.config.priority.limit(priority, self.gov.capacity)
        if isinstance(decision, Slot):
            assert before < limit
            self.slots.append(decision)
        else:
            assert before >= limit
            assert decision.retry_hint_ms >= 0
            self.yields += 1

    @precondition(lambda self: self.slots)
    @rule(index=st.integers(0, 100), outcome=st.sampled_from(["executed", "failed", "cancelled"]))
    def release(self, index: int, outcome: str) -> None:
        self.slots.pop(index % len(self.slots)).release(outcome)  # type: ignore[arg-type]

    @rule(ms=st.floats(0, 5000))
    def tick(self, ms: float) -> None:
        self.clock.advance_ms(ms)

    @rule(capacity=st.integers(1, 5))
    def ramp(self, capacity: int) -> None:
        self.gov.set_capacity(capacity)

    @invariant()
    def promises_hold(self) -> None:
        s = self.gov.stats()
        assert s.inflight == len(self.slots)
        assert s.inflight_peak <= self.max
        assert (
            s.admitted_total == s.executed_total + s.failed_total + s.cancelled_total + s.inflight
        )
        assert s.yielded_total == self.yields
        for name in (
            "admitted_total",
            "executed_total",
            "failed_total",
            "cancelled_total",
            "yielded_total",
            "inflight_peak",
        ):
            assert getattr(s, name) >= getattr(self.last, name), name
        self.last = s


GovernorMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
test_governor_state_machine = GovernorMachine.TestCase


def test_refuse_is_the_cheap_check_before_admission() -> None:
    clock = FakeClock()
    gov = make(
        clock, max_inflight=2, initial_exec_ms=100, priority=PriorityPolicy(reserved_for_high=1)
    )
    assert gov.refuse(Priority.NORMAL) is None
    admit(gov)
    refusal = gov.refuse(Priority.NORMAL)  # normal may hold one slot
    assert refusal is not None
    assert (refusal.reason, refusal.retry_hint_ms) == (YieldReason.SATURATED, 100)
    assert gov.refuse(Priority.HIGH) is None  # high may still take the reserved one
    gov.begin_cold_start(1.0)
    cold = gov.refuse(Priority.HIGH)
    assert cold is not None
    assert cold.reason is YieldReason.COLD_START
    assert gov.stats().yielded_total == 2


def test_an_unchanged_yield_is_handed_back_again_and_still_counted() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, initial_exec_ms=100)
    admit(gov)
    first = refuse(gov)
    assert refuse(gov) is first
    clock.advance_ms(10)
    later = refuse(gov)
    assert later is not first
    assert (first.retry_hint_ms, later.retry_hint_ms) == (100, 90)
    assert gov.stats().yielded_total == 3
    with pytest.raises(AttributeError):
        later.retry_hint_ms = 0  # type: ignore[misc]


def test_exec_ms_total_sums_measured_executions_only() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=3)
    done, failed, cancelled = admit(gov), admit(gov), admit(gov)
    clock.advance_ms(100)
    done.release("executed")
    clock.advance_ms(100)
    failed.release("failed")
    cancelled.release("cancelled")  # not measured: says nothing of how long work takes
    stats = gov.stats()
    assert stats.exec_ms_total == pytest.approx(300)
    assert stats.as_dict()["exec_ms_total"] == pytest.approx(300)


# -- the queue (serve --queue) ----------------------------------------------------


def test_without_a_queue_nothing_ever_waits() -> None:
    gov = make(FakeClock(), max_inflight=1)
    admit(gov)
    assert refuse(gov).reason is YieldReason.SATURATED
    assert gov.stats().as_dict()["max_queued"] == 0
    with pytest.raises(ValueError, match="max_queued"):
        GovernorConfig(max_queued=-1)


def test_queue_is_first_come_first_served_and_bounded() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, max_queued=2)
    running = admit(gov)
    first, second = admit(gov), admit(gov)
    assert first.is_waiting
    assert second.is_waiting
    woken: list[str] = []
    first.on_granted(lambda: woken.append("first"))
    second.on_granted(lambda: woken.append("second"))
    # The queue is full: the next one is refused as without a queue, its hint
    # counting the two ahead (two more executions of the initial 100 ms).
    y = refuse(gov)
    assert (y.reason, y.inflight, y.retry_hint_ms) == (YieldReason.SATURATED, 1, 300)
    clock.advance_ms(40)
    running.release("executed")
    assert woken == ["first"]
    assert not first.is_waiting
    assert second.is_waiting
    assert (gov.inflight, gov.queued) == (1, 1)
    assert first.elapsed_ms() == 0  # execution is timed from the grant, not from arrival
    first.release("executed")
    assert woken == ["first", "second"]
    s = gov.stats()
    assert (s.admitted_total, s.queued_total, s.queued_peak, s.queued, s.yielded_total) == (
        3,
        2,
        2,
        0,
        1,
    )
    assert s.queue_wait_ms_total == pytest.approx(80)  # 40 ms each


def test_higher_priorities_leave_the_queue_first() -> None:
    gov = make(FakeClock(), max_inflight=1, max_queued=None)
    running = admit(gov)
    low, normal, high = (admit(gov, p) for p in (Priority.LOW, Priority.NORMAL, Priority.HIGH))
    order: list[Priority] = []
    for slot in (low, normal, high):
        slot.on_granted(lambda slot=slot: order.append(slot.priority))  # type: ignore[misc]
    running.release("executed")
    high.release("executed")
    normal.release("executed")
    assert order == [Priority.HIGH, Priority.NORMAL, Priority.LOW]


def test_an_arrival_never_overtakes_the_queue() -> None:
    gov = make(FakeClock(), max_inflight=2, max_queued=4)
    a, b = admit(gov), admit(gov)
    waiting = admit(gov)
    gov.set_capacity(1)  # nothing frees: the queue keeps its place
    a.release("executed")
    assert waiting.is_waiting
    assert gov.inflight == 1
    gov.set_capacity(2)  # room again: the waiter gets it, not the next arrival
    assert not waiting.is_waiting
    assert admit(gov).is_waiting
    b.release("executed")


def test_a_waiter_that_leaves_frees_its_place() -> None:
    clock = FakeClock()
    gov = make(clock, max_inflight=1, max_queued=1)
    running = admit(gov)
    leaving = admit(gov)
    refuse(gov)
    clock.advance_ms(30)
    assert leaving.release("cancelled") == 0.0  # withdrawn: never admitted, nothing measured
    assert gov.queued == 0
    staying = admit(gov)  # its place is free again
    running.release("executed")
    assert not staying.is_waiting
    s = gov.stats()
    assert (s.queue_abandoned_total, s.cancelled_total, s.admitted_total) == (1, 0, 2)
    assert sum(s.queue_wait_buckets) == 2
    assert s.queue_wait_buckets[4] == 1  # the 30 ms wait, in the (25, 50] bucket


def test_an_unbounded_queue_takes_everything() -> None:
    gov = make(FakeClock(), max_inflight=2, max_queued=None)
    slots = [admit(gov) for _ in range(1_002)]
    assert (gov.inflight, gov.queued) == (2, 1_000)
    assert gov.stats().as_dict()["max_queued"] is None
    for slot in slots:
        slot.release("executed")
    s = gov.stats()
    assert (s.queued, s.executed_total, s.admitted_total) == (0, 1_002, 1_002)

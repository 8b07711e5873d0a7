"""Hedging and upstream sets in the Gate, on virtual time.

The end-to-end versions, against real servers, are in tests/e2e/test_multipath.py.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from yieldgate import (
    BreakerPolicy,
    CircuitOpenError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    HedgePolicy,
    Outcome,
    RatePolicy,
    RetryBudgetPolicy,
    RetryPolicy,
    TimeoutPolicy,
    TransportError,
    WindowPolicy,
    YieldExhaustedError,
    current_attempt,
)
from yieldgate.gate import NullInstrumentation
from yieldgate.gate._upstream import LatencyTracker

pytestmark = pytest.mark.anyio


def gate(upstreams: Any = None, **policy: Any) -> Gate:
    return Gate(
        GatePolicy(**policy),
        name="test",
        instrumentation=NullInstrumentation(),
        rng=random.Random(3),
        upstreams=upstreams,
    )


class Timed:
    """Attempt ``n`` (1-based) takes ``durations[n - 1]`` seconds, then returns its outcome."""

    def __init__(self, *durations: float, outcomes: dict[int, Any] | None = None) -> None:
        self.durations = durations
        self.outcomes = outcomes or {}
        self.started: list[tuple[int, float, str | None]] = []
        self.cancelled: list[int] = []
        self.finished: list[int] = []

    async def __call__(self) -> Any:
        info = current_attempt()
        assert info is not None
        n = info.number
        self.started.append((n, anyio.current_time(), info.upstream))
        try:
            await anyio.sleep(self.durations[min(n, len(self.durations)) - 1])
        except anyio.get_cancelled_exc_class():
            self.cancelled.append(n)
            raise
        self.finished.append(n)
        return self.outcomes.get(n, f"answer {n}")


async def test_a_slow_attempt_is_hedged_after_the_delay_and_the_loser_cancelled() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.5))
    fn = Timed(10.0, 0.2)
    start = anyio.current_time()
    assert await g.call(fn) == "answer 2"
    assert anyio.current_time() - start == pytest.approx(0.7, abs=0.01)
    assert fn.started[1][1] - start == pytest.approx(0.5, abs=0.01)  # hedged at the delay
    assert fn.cancelled == [1]  # the loser, at once
    s = g.statistics()
    assert (s.attempts, s.hedges, s.hedge_wins, s.losers_cancelled) == (2, 1, 1, 1)
    assert s.window.inflight == 0


async def test_an_attempt_that_answers_before_the_delay_is_not_hedged() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.5))
    fn = Timed(0.3)
    assert await g.call(fn) == "answer 1"
    s = g.statistics()
    assert (s.attempts, s.hedges) == (1, 0)


async def test_the_primary_can_still_win_and_the_hedge_is_cancelled() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.5))
    fn = Timed(0.8, 5.0)
    assert await g.call(fn) == "answer 1"
    assert fn.cancelled == [2]
    s = g.statistics()
    assert (s.hedges, s.hedge_wins, s.losers_cancelled) == (1, 0, 1)


async def test_at_most_max_hedges() -> None:
    g = gate(hedge=HedgePolicy(delay_s=0.1, max_hedges=2), window=WindowPolicy.fixed(8))
    fn = Timed(10.0, 10.0, 10.0, 10.0)
    start = anyio.current_time()
    await g.call(fn)
    # Three attempts ran at once (0, 0.1 and 0.2 s); the first answered at 10 s.
    assert [n for n, _, _ in fn.started] == [1, 2, 3]
    assert anyio.current_time() - start == pytest.approx(10.0, abs=0.01)
    assert g.statistics().hedges == 2


async def test_a_yield_on_any_attempt_stops_hedging() -> None:
    g = gate(hedge=HedgePolicy(delay_s=0.1, max_hedges=3))
    fn = Timed(1.0, 0.05, 1.0, 1.0, outcomes={2: Outcome.yielded(5.0)})
    assert await g.call(fn) == "answer 1"
    # The hedge was told "too much load": no third or fourth attempt followed it.
    assert [n for n, _, _ in fn.started] == [1, 2]
    assert g.statistics().yields == 1


async def test_hedges_spend_the_retry_budget() -> None:
    g = gate(
        hedge=HedgePolicy.fixed(0.1),
        budget=RetryBudgetPolicy(ratio=0.0, min_per_s=0.0),
    )
    fn = Timed(2.0, 0.1)
    assert await g.call(fn) == "answer 1"  # no budget: no hedge, the slow answer
    s = g.statistics()
    assert (s.attempts, s.hedges) == (1, 0)
    assert s.hedges_denied >= 1


async def test_a_hedge_never_queues_for_a_window_slot() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.1), window=WindowPolicy.fixed(1))
    fn = Timed(1.0, 0.1)
    assert await g.call(fn) == "answer 1"
    assert g.statistics().hedges == 0


async def test_the_observed_quantile_sets_the_delay() -> None:
    policy = HedgePolicy(quantile=0.9, min_samples=10, initial_delay_s=5.0)
    g = gate(hedge=policy)
    for _ in range(20):
        await g.call(Timed(0.2))  # 20 answers in 0.2 s: the 90th percentile is 0.2 s
    fn = Timed(3.0, 0.1)
    start = anyio.current_time()
    assert await g.call(fn) == "answer 2"
    assert fn.started[1][1] - start == pytest.approx(0.2, abs=0.01)


async def test_before_enough_samples_the_initial_delay_applies() -> None:
    g = gate(hedge=HedgePolicy(initial_delay_s=0.7, min_samples=5))
    fn = Timed(3.0, 0.1)
    start = anyio.current_time()
    await g.call(fn)
    assert fn.started[1][1] - start == pytest.approx(0.7, abs=0.01)


async def test_failures_of_every_attempt_go_to_the_retry_loop() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.1), retry=RetryPolicy(max_attempts=4, base_s=0.01))
    boom = Outcome.retryable(TransportError("reset"))
    fn = Timed(0.3, 0.3, 0.1, outcomes={1: boom, 2: boom})
    assert await g.call(fn) == "answer 3"
    assert g.statistics().hedges >= 1


async def test_a_deadline_during_a_hedged_round_is_a_deadline_error() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.1))
    with pytest.raises(DeadlineExceededError):
        await g.call(Timed(5.0, 5.0), timeout=1.0)
    assert g.statistics().window.inflight == 0


async def test_a_held_hedged_call_keeps_the_winners_slot_and_discards_a_late_winner() -> None:
    g = gate(hedge=HedgePolicy.fixed(0.1))
    discarded: list[Any] = []

    async def discard(value: Any) -> None:
        discarded.append(value)

    async def both_answer() -> str:
        info = current_attempt()
        assert info is not None
        if info.number == 1:
            await anyio.sleep(0.3)  # the primary answers first, at 0.3 s
        else:
            # The hedge (from 0.1 s) finishes its answer even when it is cancelled
            # as the loser, at 0.4 s: a second success, which nobody may keep.
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.3)
        return f"stream {info.number}"

    async with g.hold(both_answer, discard=discard) as value:
        assert g.statistics().window.inflight == 1  # the winner's slot, held
    assert value == "stream 1"
    assert discarded == ["stream 2"]
    assert g.statistics().window.inflight == 0


async def test_item1_a_held_hedged_call_cancelled_while_a_loser_cleans_up_strands_nothing() -> None:
    # The hedge won; the caller was cancelled while the loser cleaned up under a
    # shield: the winner's slot stayed taken for ever and its value (a pooled HTTP
    # response) was never closed.
    g = gate(hedge=HedgePolicy.fixed(0.05), window=WindowPolicy.fixed(2))
    discarded: list[Any] = []

    async def discard(value: Any) -> None:
        discarded.append(value)

    async def attempt() -> str:
        info = current_attempt()
        assert info is not None
        if info.number == 1:
            try:
                await anyio.sleep(10)
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(0.3)  # cleaning up
                raise
        return f"value {info.number}"

    entered = False
    with anyio.move_on_after(0.1):
        async with g.hold(attempt, discard=discard):
            entered = True
    assert not entered  # cancelled before the value was handed out
    assert g.statistics().window.inflight == 0
    assert discarded == ["value 2"]
    assert await g.call(attempt) == "value 2"  # the Gate still works: the hedge wins again


async def _hedge_as_the_ramp_restarts(g: Gate, then: Callable[[], None] | None = None) -> None:
    """A hedged call on ``g``, whose rate cap is at its top when a cold-start yield
    restarts its ramp (to 1/s) just before the hedge is due: a hedge that waited for
    a rate token would wait past the primary's answer. ``then`` runs right after the
    cold-start yield, while the primary is in flight."""
    await g.call(Timed(0.0))
    await anyio.sleep(30)  # the ramp is at its top

    async def cold() -> Outcome:
        return Outcome.yielded(10.0, "cold_start")  # restarts the ramp

    async with anyio.create_task_group() as tg:

        async def primary() -> None:
            assert await g.call(Timed(0.3)) == "answer 1"
            tg.cancel_scope.cancel()

        tg.start_soon(primary)
        await anyio.sleep(0.05)
        # (a low-priority call: its hint holds low priority only, not the hedge)
        tg.start_soon(functools.partial(g.call, cold, priority="low"))
        if then is not None:
            await anyio.sleep(0.001)
            then()


async def test_item2_a_hedge_that_would_wait_for_the_rate_cap_strands_no_slot() -> None:
    # The hedge took a window slot and a breaker ticket, then awaited the rate cap
    # (slow after a ramp restart); the primary won meanwhile and both were lost.
    g = gate(
        hedge=HedgePolicy.fixed(0.1),
        window=WindowPolicy.fixed(4),
        rate=RatePolicy(per_s=50, ramp_from_per_s=1, ramp_s=10),
    )
    await _hedge_as_the_ramp_restarts(g)
    assert g.statistics().window.inflight == 0


async def test_item2_a_hedge_never_takes_the_half_open_probe() -> None:
    g = gate(
        hedge=HedgePolicy.fixed(0.1),
        window=WindowPolicy.fixed(4),
        rate=RatePolicy(per_s=50, ramp_from_per_s=1, ramp_s=10),
        breaker=BreakerPolicy(fail_max=1, reset_timeout_s=0.01),
    )
    # Failures elsewhere open the breaker; a probe is due at 0.061 s.
    await _hedge_as_the_ramp_restarts(g, then=g._core.upstreams[0].breaker._cb.open)
    # No hedge took the probe and lost it: the next call can probe, and closes it.
    await anyio.sleep(1)
    assert await g.call(Timed(0.0)) == "answer 1"
    assert g.statistics().breaker == "closed"


# -- upstream sets -------------------------------------------------------------------


async def test_attempts_name_their_upstream_and_target() -> None:
    g = gate(upstreams={"a": "http://a.test", "b": "http://b.test"})
    seen = []

    async def fn() -> str:
        info = current_attempt()
        assert info is not None
        seen.append((info.upstream, info.target))
        return "ok"

    for _ in range(20):
        await g.call(fn)
    assert set(seen) == {("a", "http://a.test"), ("b", "http://b.test")}
    assert g.upstreams == ("a", "b")
    stats = g.statistics()
    assert [u.name for u in stats.upstreams] == ["a", "b"]
    assert sum(u.attempts for u in stats.upstreams) == 20


async def test_a_gate_without_upstreams_reports_none() -> None:
    g = gate()
    info: list[Any] = []

    async def fn() -> None:
        info.append(current_attempt())

    await g.call(fn)
    assert info[0].upstream is None
    assert info[0].target is None
    assert g.upstreams == ()
    with pytest.raises(ValueError, match="built without upstreams"):
        g.add_upstream("x")


async def test_add_upstream_refuses_a_second_target_for_a_name() -> None:
    g = gate(upstreams=["a"])
    g.add_upstream("a")  # the same again: nothing happens
    g.add_upstream("a", "tcp://a:1")  # a target for a name that had none
    assert g._core.upstreams[0].target == "tcp://a:1"
    g.add_upstream("a")
    g.add_upstream("b", "tcp://b:1")
    with pytest.raises(ValueError, match="already registered"):
        g.add_upstream("b", "tcp://c:1")
    with pytest.raises(ValueError, match="at least one"):
        gate(upstreams=[])


async def test_the_cheaper_upstream_takes_the_traffic() -> None:
    g = gate(upstreams=["slow", "fast"])

    async def fn() -> str:
        info = current_attempt()
        assert info is not None
        await anyio.sleep(1.0 if info.upstream == "slow" else 0.05)
        return info.upstream or ""

    chosen = [await g.call(fn) for _ in range(40)]
    # Both measured early on; then the latency cost sends nearly everything to "fast".
    assert chosen[-20:].count("fast") == 20


async def test_failover_when_an_upstreams_breaker_is_open() -> None:
    g = gate(
        upstreams=["down", "up"],
        breaker=BreakerPolicy(fail_max=2, reset_timeout_s=30),
        retry=RetryPolicy(max_attempts=3, base_s=0.01),
    )

    async def fn() -> Any:
        info = current_attempt()
        assert info is not None
        if info.upstream == "down":
            return Outcome.retryable(TransportError("connection refused"))
        return "served"

    results = [await g.call(fn) for _ in range(30)]
    assert results == ["served"] * 30
    by_name = {u.name: u for u in g.statistics().upstreams}
    assert by_name["down"].breaker == "open"
    assert by_name["down"].attempts <= 3  # opened after two; at most one probe-free slip
    assert g.statistics().breaker == "mixed"


async def test_every_breaker_open_is_a_circuit_error() -> None:
    g = gate(upstreams=["a", "b"], breaker=BreakerPolicy(fail_max=1, reset_timeout_s=30))

    async def fn() -> Any:
        return Outcome.retryable(TransportError("down"))

    with pytest.raises(CircuitOpenError):
        await g.call(fn)
    with pytest.raises(CircuitOpenError) as caught:
        await g.call(fn)
    assert caught.value.retry_after_s is not None
    assert caught.value.retry_after_s > 0


async def test_a_hint_holds_only_the_upstream_that_gave_it() -> None:
    g = gate(upstreams=["busy", "free"], retry=RetryPolicy(max_yields=4))

    async def fn() -> Any:
        info = current_attempt()
        assert info is not None
        if info.upstream == "busy":
            return Outcome.yielded(30.0)
        return "served"

    start = anyio.current_time()
    results = [await g.call(fn) for _ in range(10)]
    assert results == ["served"] * 10
    # Nobody waited 30 s: the yield held "busy" back, and "free" answered.
    assert anyio.current_time() - start < 1.0
    by_name = {u.name: u for u in g.statistics().upstreams}
    assert by_name["busy"].yields == 1
    assert by_name["busy"].hold_s > 25


async def test_a_hedge_races_another_upstream() -> None:
    g = gate(upstreams=["a", "b"], hedge=HedgePolicy.fixed(0.2))
    fn = Timed(10.0, 0.1)
    await g.call(fn)
    (_, _, first), (_, _, second) = fn.started
    assert {first, second} == {"a", "b"}


async def test_a_loser_teaches_the_router_it_was_slow() -> None:
    g = gate(upstreams=["slow", "fast"], hedge=HedgePolicy.fixed(0.2))

    async def fn() -> str:
        info = current_attempt()
        assert info is not None
        await anyio.sleep(5.0 if info.upstream == "slow" else 0.05)
        return info.upstream or ""

    winners = [await g.call(fn) for _ in range(10)]
    assert winners == ["fast"] * 10
    by_name = {u.name: u for u in g.statistics().upstreams}
    # "slow" never answered, but lost races after 0.2 s: it now costs more than "fast".
    assert by_name["slow"].attempts <= 2
    assert by_name["slow"].successes == 0


async def test_attempt_timeouts_still_apply_per_attempt() -> None:
    g = gate(
        hedge=HedgePolicy.fixed(0.1, max_hedges=1),
        timeout=TimeoutPolicy(attempt_s=0.5, total_s=10.0),
        retry=RetryPolicy(base_s=0.01),
    )
    fn = Timed(5.0, 5.0, 0.05)
    assert await g.call(fn) == "answer 3"


def test_hedge_policy_validation() -> None:
    with pytest.raises(ValueError, match="max_hedges"):
        HedgePolicy(max_hedges=0)
    with pytest.raises(ValueError, match="quantile"):
        HedgePolicy(quantile=1.0)
    with pytest.raises(ValueError, match="delay_s"):
        HedgePolicy(delay_s=-1.0)
    with pytest.raises(ValueError, match="samples"):
        HedgePolicy(min_samples=50, samples=10)


def test_latency_tracker_quantiles_and_lower_bounds() -> None:
    t = LatencyTracker(100)
    assert t.quantile(0.95) is None
    for ms in range(1, 101):
        t.record(ms / 1000)
    assert t.quantile(0.95) == pytest.approx(0.095)
    assert t.quantile(0.5) == pytest.approx(0.05)
    before = t.ewma_s
    assert before is not None
    t.record_at_least(before / 2)  # a lower bound below the average says nothing
    assert t.ewma_s == before
    t.record_at_least(1.0)
    assert t.ewma_s is not None
    assert t.ewma_s > before
    assert len(t) == 100  # lower bounds stay out of the quantiles


async def test_no_retry_shares_no_hints() -> None:
    # A caller that retries elsewhere is never held back by another call's yield.
    g = gate(retry=RetryPolicy.no_retry())

    async def busy() -> Any:
        return Outcome.yielded(30.0)

    with pytest.raises(YieldExhaustedError):
        await g.call(busy)
    start = anyio.current_time()
    assert await g.call(Timed(0.1)) == "answer 1"
    assert anyio.current_time() - start == pytest.approx(0.1, abs=0.01)

"""A provider's 429 for one scope's quota holds that scope alone (issue 39, defect 4).

One Gate serving two models, as a user's one client does: a 429 with a hint on
model a holds model a's calls (at that priority and below), released one by
one over the hint's jitter, and never model b's, whose own quota has room.
Overload signals (503, 529, TGI's overloaded 429, a governed yield) and calls
that name no scope hold the whole upstream's window, as before. Virtual time.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import httpx
import pytest

from yieldgate import (
    Cost,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    Outcome,
    Priority,
    QuotaPolicy,
    WindowPolicy,
)
from yieldgate.dialects import OPENAI, TGI
from yieldgate.gate import NullInstrumentation
from yieldgate.gate._quota import Claim, Quota

pytestmark = pytest.mark.anyio

# Model b's answers: its quota has room (99 of 100 requests left).
B_ROOM = {
    "x-ratelimit-limit-requests": "100",
    "x-ratelimit-remaining-requests": "99",
    "x-ratelimit-reset-requests": "600ms",
}


def gate_for(policy: GatePolicy | None = None) -> Gate:
    return Gate(
        policy or GatePolicy(),
        instrumentation=NullInstrumentation(),
        clock=anyio.current_time,
        rng=random.Random(7),
    )


def quota_429(hint_s: float) -> httpx.Response:
    """A provider's quota refusal: OpenAI's 429 with a ``retry-after``."""
    error = {"message": "Rate limit reached for requests", "code": "rate_limit_exceeded"}
    return httpx.Response(429, headers={"retry-after": f"{hint_s:g}"}, json={"error": error})


def ok() -> httpx.Response:
    return httpx.Response(200, json={}, headers=B_ROOM)


class Provider:
    """Answers each model from a script of its own (then 200s), noting when each
    attempt was sent, on the loop's clock."""

    def __init__(self, script: dict[str, list[httpx.Response]]) -> None:
        self.script = script
        self.sent: list[tuple[str, float]] = []
        self.refused = anyio.Event()

    def attempt(self, model: str) -> Callable[[], Awaitable[httpx.Response]]:
        async def send() -> httpx.Response:
            self.sent.append((model, anyio.current_time()))
            queue = self.script.get(model)
            if queue:
                reply = queue.pop(0)
                if reply.status_code == 429 or reply.status_code >= 500:
                    self.refused.set()
                return reply
            return ok()

        return send

    def times(self, model: str) -> list[float]:
        return [t for m, t in self.sent if m == model]


async def timed(gate: Gate, provider: Provider, model: str, **kw: Any) -> float:
    """How long one call of ``model`` took, from its start."""
    start = anyio.current_time()
    await gate.call(provider.attempt(model), cost=Cost(1, 10, 10, 0, model), classify=OPENAI, **kw)
    return anyio.current_time() - start


async def test_a_429_on_one_model_holds_that_model_alone() -> None:
    """Regression: on main, model b's call waited 5.91 s behind model a's hint (the
    whole upstream's window was held)."""
    gate = gate_for()
    provider = Provider({"a": [quota_429(5.0)]})
    waited: dict[str, float] = {}

    async def a_first() -> None:
        waited["a, refused"] = await timed(gate, provider, "a")

    async with anyio.create_task_group() as tg:
        tg.start_soon(a_first)
        await provider.refused.wait()
        waited["b"] = await timed(gate, provider, "b")
        waited["a, later"] = await timed(gate, provider, "a")
    assert waited["b"] < 0.01, waited
    # Model a's calls wait out the hint: the refused call's retry and a new one.
    assert waited["a, later"] >= 5.0 - 0.01, waited
    assert 5.0 <= waited["a, refused"] <= 5.0 * 1.5, waited
    assert gate._core.audit() == []


async def test_held_calls_go_one_by_one_over_the_jitter_in_their_order() -> None:
    gate = gate_for()
    provider = Provider({"a": [quota_429(2.0)]})
    order: list[int] = []

    async def one(i: int) -> None:
        await gate.call(
            provider.attempt("a"), cost=Cost(1, 10, 10, 0, "a"), classify=OPENAI, timeout=None
        )
        order.append(i)

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, -1)  # refused: its retry waits in its place, first
        await provider.refused.wait()
        for i in range(10):
            tg.start_soon(one, i)
            await anyio.sleep(0.01)  # one after the other: their arrival order is known
    times = provider.times("a")[1:]  # the retry and the ten, once released
    assert len(times) == 11
    # None before the hint, every one by its end with the jitter (2 s * 1.5), one by one.
    assert all(2.0 <= t - provider.times("a")[0] <= 3.0 + 0.01 for t in times), times
    assert len(set(times)) == len(times), times
    assert order == [-1, *range(10)]


async def test_a_hold_at_normal_lets_that_models_high_calls_through() -> None:
    gate = gate_for()
    provider = Provider({"a": [quota_429(5.0)]})
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: timed(gate, provider, "a"))
        await provider.refused.wait()
        assert await timed(gate, provider, "a", priority=Priority.HIGH) < 0.01
        assert await timed(gate, provider, "a", priority=Priority.LOW) >= 5.0 - 0.01


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(lambda: httpx.Response(503, headers={"retry-after": "5"}), id="503"),
        pytest.param(
            lambda: httpx.Response(
                529, headers={"retry-after": "5"}, json={"error": {"type": "overloaded_error"}}
            ),
            id="529",
        ),
    ],
)
async def test_an_overload_still_holds_the_whole_upstream(
    reply: Callable[[], httpx.Response],
) -> None:
    """An upstream that is overloaded is so for every model: its window is held."""
    gate = gate_for()
    provider = Provider({"a": [reply()]})
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: timed(gate, provider, "a"))
        await provider.refused.wait()
        assert await timed(gate, provider, "b") >= 5.0 - 0.01


@pytest.mark.parametrize(
    ("reply", "classify", "hint_s"),
    [
        pytest.param(
            httpx.Response(429, headers={"retry-after": "3"}, json={"error_type": "overloaded"}),
            TGI,
            3.0,
            id="tgi-overloaded-429",
        ),
        pytest.param(Outcome.yielded(2.0, "saturated"), None, 2.0, id="governed-yield"),
    ],
)
async def test_tgis_overloaded_429_and_a_governed_yield_hold_the_window(
    reply: Any, classify: Any, hint_s: float
) -> None:
    gate = gate_for()
    refused = anyio.Event()

    async def model_a() -> Any:
        if not refused.is_set():
            refused.set()
            return reply
        return httpx.Response(200, json={})

    async def model_b() -> None:
        return None

    kw: dict[str, Any] = {} if classify is None else {"classify": classify}
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: gate.call(model_a, cost=Cost(1, 1, 1, 0, "a"), **kw))
        await refused.wait()
        start = anyio.current_time()
        await gate.call(model_b, cost=Cost(1, 1, 1, 0, "b"))
        assert anyio.current_time() - start >= hint_s - 0.01


async def test_a_429_for_a_call_naming_no_scope_holds_the_window() -> None:
    gate = gate_for()
    provider = Provider({"": [quota_429(4.0)]})
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: timed(gate, provider, ""))
        await provider.refused.wait()
        assert await timed(gate, provider, "b") >= 4.0 - 0.01


async def test_a_held_call_goes_at_its_latest_start_for_its_deadline() -> None:
    """Its turn would come after its deadline allows (many are held ahead of it): it
    goes when it must, never before the hint; a hint past its deadline fails it at
    once."""
    gate = gate_for()
    provider = Provider({"a": [quota_429(10.0)]})
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: timed(gate, provider, "a", timeout=None))
        await provider.refused.wait()
        start = anyio.current_time()
        with pytest.raises(DeadlineExceededError, match="asked to wait"):
            await timed(gate, provider, "a", timeout=1.0)
        assert anyio.current_time() == start
        for _ in range(20):  # in line before it, released over [10 s, 15 s]
            tg.start_soon(lambda: timed(gate, provider, "a", timeout=None))
        await anyio.sleep(0.01)
        took = await timed(gate, provider, "a", timeout=12.0)
        # The hint passed (10 s), well before its turn: it went by its deadline (its
        # latest start, 12 s less half the 2 s left after the hint).
        assert 10.0 - 0.01 <= took <= 11.0 + 0.01, took


async def test_a_call_waiting_for_a_slot_when_its_scope_is_held_waits_for_the_hint() -> None:
    """Its claim was taken before the hold: given a slot, it goes back to the quota's
    lane rather than straight into the refusal."""
    gate = gate_for(GatePolicy(window=WindowPolicy.fixed(1)))
    provider = Provider({"a": [quota_429(5.0)]})
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: timed(gate, provider, "a"))
        tg.start_soon(lambda: timed(gate, provider, "a"))  # waits for the one slot
        tg.start_soon(lambda: timed(gate, provider, "b"))
    first, *after = provider.times("a")
    assert len(after) == 2
    assert all(t - first >= 5.0 - 0.01 for t in after), provider.sent
    assert provider.times("b")[0] - first < 0.01


async def test_with_budgets_of_its_own_one_lane_still_lets_other_models_pass() -> None:
    """The caller's own budgets put every scope in one lane: model a's held calls
    stand aside there for model b's."""
    gate = gate_for(GatePolicy(quota=QuotaPolicy(requests_per_minute=6000, learn=False)))
    provider = Provider({"a": [quota_429(5.0)]})
    async with anyio.create_task_group() as tg:
        tg.start_soon(lambda: timed(gate, provider, "a"))
        await provider.refused.wait()
        tg.start_soon(lambda: timed(gate, provider, "a"))
        await anyio.sleep(0.1)
        assert await timed(gate, provider, "b") < 0.01


# -- the lanes, sans-IO ---------------------------------------------------------------


def claim(scope: str, priority: Priority = Priority.NORMAL, key: float = 0.0) -> Claim:
    return Claim(Cost(1, 10, 10, 0, scope), priority, key)


def test_a_scope_hold_keeps_its_claims_back_until_released() -> None:
    quota = Quota(rng=random.Random(1))
    until = quota.lanes.hold("a", Priority.NORMAL, 2.0, 0.0)
    assert until == pytest.approx(3.0)
    held, other = claim("a"), claim("b")
    assert not quota.try_take(held, 0.0)
    assert quota.try_take(other, 0.0)
    woken: list[str] = []
    quota.join(held, lambda: woken.append("held"))
    assert quota.at_head(held, 0.0)
    assert quota.take_queued(held, 0.0) == pytest.approx(2.0)  # nobody before the hint
    # Released once its turn comes (with one claim held, somewhere in the jitter).
    due = quota.take_queued(held, 2.0)
    assert due is not None
    assert 2.0 <= due <= 3.0
    assert quota.at_head(held, due)
    assert quota.take_queued(held, due) is None
    assert not quota.lanes.held_back(held, due)
    # A later hint holds its scope again; the claim released from the first is free.
    quota.lanes.hold("a", Priority.NORMAL, 1.0, 2.5)
    assert quota.lanes.held_back(claim("a"), 2.6)
    quota.refund(held, 3.0)
    quota.refund(other, 3.0)
    assert quota.audit() == []


def test_in_one_lane_a_new_hold_wakes_the_claim_that_now_goes_first() -> None:
    """The caller's own budgets: every scope in one lane. Model a's head sleeps towards
    its take; a hold on a makes model b's claim behind it the first that may go: it is
    woken (it waited with no timer of its own)."""
    quota = Quota(requests_per_minute=60, rng=random.Random(1))
    assert quota.try_take(Claim(Cost(60), Priority.NORMAL, 0.0), 0.0)  # the minute spent
    woken: list[str] = []
    a, b = claim("a", key=1.0), claim("b", key=2.0)
    for c, name in ((a, "a"), (b, "b")):
        assert not quota.try_take(c, 0.0)
        quota.join(c, lambda name=name: woken.append(name))
    assert quota.at_head(a, 0.0)
    assert not quota.at_head(b, 0.0)
    quota.lanes.hold("a", Priority.NORMAL, 5.0, 0.0)
    assert woken == ["a", "b"]
    assert quota.at_head(b, 0.0)  # b goes first now, as the budget allows
    assert quota.take_queued(b, 0.0) == pytest.approx(1.0)
    assert quota.take_queued(a, 0.0) == pytest.approx(5.0)  # a, at the hint
    for c in (a, b):
        quota.leave(c, 0.0)


def test_reading_the_same_hold_again_does_not_restart_its_release() -> None:
    """A fleet's members read one another's holds every 25 ms, on their own clocks: the
    same hold read again (a few ms later) changes nothing, and wakes nobody."""
    quota = Quota(rng=random.Random(1))
    woken: list[str] = []
    first, second = claim("a", key=1.0), claim("a", key=2.0)
    quota.lanes.hold("a", Priority.NORMAL, 2.0, 0.0)
    for c in (first, second):
        assert not quota.try_take(c, 0.0)
        quota.join(c, lambda: woken.append("woken"))
    woken.clear()
    due = quota.take_queued(first, 2.0)
    assert due is not None
    for now in (0.5, 1.0, 2.0):
        quota.lanes.hold("a", Priority.NORMAL, 2.0 - now + 0.003, now)  # read again, later
        assert quota.take_queued(first, 2.0) == due
    assert woken == []
    # A hold that really is later (another 429) holds them again, from its own hint.
    quota.lanes.hold("a", Priority.NORMAL, 2.0, 1.5)
    assert woken == ["woken"]
    assert quota.take_queued(first, 2.0) == pytest.approx(3.5)
    for c in (first, second):
        quota.leave(c, 2.0)


@pytest.mark.parametrize(("scope", "shrinks"), [("a", False), ("", True)], ids=["model", "none"])
async def test_a_quota_429_narrows_the_window_only_when_it_names_no_scope(
    scope: str, shrinks: bool
) -> None:
    """One model's quota spent says nothing of the upstream's load: the window the other
    models' calls share keeps its limit (a 429 for a call that names no model is the
    upstream's, and narrows it as a yield does)."""
    gate = gate_for(GatePolicy(window=WindowPolicy(initial=4, max=4)))
    provider = Provider({scope or "a": [quota_429(1.0)]})
    before = gate.statistics().window.limit
    await gate.call(provider.attempt(scope or "a"), cost=Cost(1, 10, 10, 0, scope), classify=OPENAI)
    assert provider.refused.is_set()
    after = gate.statistics().window.limit
    assert (after < before) is shrinks, (before, after)
    assert gate._core.audit() == []

"""The fleet's first reading as one member sees it, sans-IO (``_first_reading``): who asks,
who probes, and what each way an ask or a probe ends leaves to do.

The Gate-level and Redis-level behaviour (two members, a real Redis) is in
tests/fleet/test_first_reading.py; here the state machine alone, its attempts
stand-ins holding only their ledger's entry (``first``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from yieldgate import FleetPolicy
from yieldgate.fleet import BucketShape, FirstReading
from yieldgate.gate._cost import Bucket
from yieldgate.gate._first_reading import ASKING, PROBE, PROBED_TTL_S, FirstReadings
from yieldgate.gate._policy import RetryBudgetPolicy
from yieldgate.gate._shared import FleetOp, Shared

UP = "api"


def upstream() -> Any:
    quota = SimpleNamespace(learn=True, learnt=False, buckets={})
    return SimpleNamespace(name=UP, quota=quota)


def attempt() -> Any:
    return SimpleNamespace(first=None)


def readings(wait_s: float = 5.0) -> FirstReadings:
    return FirstReadings(FleetPolicy(first_reading_s=wait_s))


def asked(first: FirstReadings, up: Any, state: str, now: float = 0.0) -> Any:
    """An attempt that asked the fleet and was told ``state``."""
    a = attempt()
    op, until = first.step(up, a, now, None, True)
    assert op == ("first", (UP, first.wait_s))
    assert until is None
    assert a.first == ASKING
    shapes, after = first.told(up, a, FirstReading(state, {}), now)
    assert (shapes, after) == ({}, None)
    assert a.first == (PROBE if state == "mine" else None)  # told "mine", it probes
    return a


def test_the_member_told_mine_probes_with_its_next_attempt_and_the_others_wait() -> None:
    first, up = readings(), upstream()
    asker = asked(first, up, "mine")
    assert first.step(up, asker, 0.0, None, True) == (None, None)  # the probe: go
    assert asker.first == PROBE
    other = attempt()
    op, until = first.step(up, other, 0.0, None, True)
    assert op is None
    assert until is not None
    assert other.first is None
    assert first.probing(UP)


def test_a_probe_that_ends_unanswered_goes_to_a_waiting_call_of_its_member() -> None:
    first, up = readings(), upstream()
    probe = asked(first, up, "mine")
    waiter, woken = attempt(), []
    first.park(up, waiter, lambda: woken.append(1))
    assert first.left(up, probe, read=False, answered=False) is None  # kept: handed on
    assert woken == [1]
    assert probe.first is None
    assert first.step(up, waiter, 0.1, None, True) == (None, None)
    assert waiter.first == PROBE


def test_a_probe_that_ends_unanswered_with_nobody_waiting_goes_back_to_the_fleet() -> None:
    first, up = readings(), upstream()
    probe = asked(first, up, "mine")
    assert first.left(up, probe, read=False, answered=False) == ("abandon_first", (UP,))
    # The member's next call asks again.
    again = attempt()
    assert first.step(up, again, 0.1, None, True)[0] == ("first", (UP, first.wait_s))


def test_only_an_answer_that_came_back_settles_the_reading() -> None:
    first, up = readings(), upstream()
    probe = asked(first, up, "mine")
    up.quota.buckets = {
        "openai:tokens": Bucket("openai:tokens", "tokens", 1000.0, 10.0, 0.0, learnt=True),
        "policy:requests": Bucket("policy:requests", "requests", 60.0, 1.0, 0.0, learnt=False),
    }
    op = first.left(up, probe, read=True, answered=False)  # a 429 with its headers
    assert op == ("probed", (UP, {"openai:tokens": ("tokens", 1000.0, 10.0)}, PROBED_TTL_S))
    assert first.settled(up)
    assert not first.probing(UP)
    assert first.audit() == []


def test_a_success_without_quota_headers_says_the_upstream_has_none() -> None:
    first, up = readings(), upstream()
    probe = asked(first, up, "mine")
    assert first.left(up, probe, read=False, answered=True) == ("probed", (UP, {}, PROBED_TTL_S))
    assert first.settled(up)


def test_an_ask_that_ends_unanswered_lets_the_next_call_ask_at_once() -> None:
    first, up = readings(), upstream()
    a, b, woken = attempt(), attempt(), []
    first.step(up, a, 0.0, None, True)
    first.step(up, b, 0.0, None, True)  # waits while a asks
    first.park(up, b, lambda: woken.append(1))
    assert first.audit() != []
    assert first.left(up, a, read=False, answered=False) is None  # cancelled, say
    assert woken == [1]
    assert first.step(up, b, 0.0, None, True)[0] == ("first", (UP, first.wait_s))


def test_redis_not_answering_the_ask_ends_the_wait_and_hands_back_what_it_may_hold() -> None:
    first, up = readings(), upstream()
    a = attempt()
    first.step(up, a, 0.0, None, True)
    shapes, after = first.told(up, a, None, 0.0)
    assert (shapes, after) == ({}, ("abandon_first", (UP,)))
    assert first.settled(up)


def test_the_fleets_shapes_known_end_the_wait() -> None:
    first, up = readings(), upstream()
    a = attempt()
    first.step(up, a, 0.0, None, True)
    shapes = {"openai:tokens": BucketShape("tokens", 1000.0, 10.0)}
    assert first.told(up, a, FirstReading("known", shapes), 0.0) == (shapes, None)
    assert first.settled(up)


def test_a_member_gone_alone_reads_the_quota_itself_and_gives_back_the_fleets_probe() -> None:
    """Redis away (or slower than the budget) while the member waits for the fleet's
    reading: on main its whole burst went blind at once; now one call of its reads
    the quota, the others wait for that answer."""
    first, up = readings(), upstream()
    probe = asked(first, up, "mine")
    waiting = attempt()
    first.park(up, waiting, lambda: None)
    assert first.left(up, probe, read=False, answered=False) is None  # handed on: not taken yet
    assert first.alone(up, 1.0) == ("abandon_first", (UP,))  # the fleet's probe goes back
    assert not first.settled(up)
    first.park(up, waiting, None)
    assert first.step(up, waiting, 1.0, None, False) == (None, None)  # the member's own probe
    assert waiting.first == PROBE
    op, until = first.step(up, attempt(), 1.0, None, False)
    assert op is None
    assert until is not None  # the others wait for its answer
    # A member that was only waiting reads the quota itself too, and gives back nothing.
    first, up = readings(), upstream()
    asked(first, up, "other")
    assert first.alone(up, 1.0) is None
    own = attempt()
    assert first.step(up, own, 1.0, None, False) == (None, None)
    assert own.first == PROBE
    # Bounded: first_reading_s after it went alone, every call goes.
    late = attempt()
    assert first.step(up, late, 6.0, None, False) == (None, None)
    assert late.first is None
    assert first.settled(up)
    # A probe out ends as it ends (settled, or handed back then).
    first, up = readings(), upstream()
    probe = asked(first, up, "mine")
    assert first.step(up, probe, 0.0, None, True) == (None, None)
    assert first.alone(up, 1.0) is None
    assert first.probing(UP)
    # Redis away from the start: as alone, no wait.
    first, up = readings(), upstream()
    assert first.step(up, attempt(), 0.0, None, False) == (None, None)


def test_past_the_wait_one_call_reads_the_quota_and_the_others_wait_for_it() -> None:
    """The fleet's reading did not come within ``first_reading_s`` (a probing member or
    Redis too slow): the member reads the quota itself with one call, not its whole
    burst blind (on main, every call went at once: a wave of 429s at 5 s), and the
    others wait for that answer, ``first_reading_s`` more at most."""
    first, up = readings(wait_s=5.0), upstream()
    asked(first, up, "other")
    late, later = attempt(), attempt()
    assert first.step(up, late, 5.0, None, True) == (None, None)  # the member's own probe
    assert late.first == PROBE
    op, until = first.step(up, later, 5.0, None, True)
    assert op is None
    assert until is not None
    assert 5.0 < until <= 10.0
    assert not first.settled(up)
    woken: list[int] = []
    first.park(up, later, lambda: woken.append(1))
    # The probe failed: handed on to the call that waits (not back to asking the fleet).
    assert first.left(up, late, read=False, answered=False) is None
    assert woken == [1]
    first.park(up, later, None)
    assert first.step(up, later, 6.0, None, True) == (None, None)
    assert later.first == PROBE
    # Its answer settles the reading, and teaches the fleet what it read.
    bucket = Bucket("openai:tokens", "tokens", 100.0, 1.0, 6.0, learnt=True)
    up.quota.buckets[bucket.key] = bucket
    op = first.left(up, later, read=True, answered=True)
    assert op == ("probed", (UP, {"openai:tokens": ("tokens", 100.0, 1.0)}, PROBED_TTL_S))
    assert first.settled(up)
    assert first.audit() == []


def test_the_wait_is_bounded_twice_at_most() -> None:
    first, up = readings(wait_s=5.0), upstream()
    asked(first, up, "other")
    probe, other = attempt(), attempt()
    assert first.step(up, probe, 5.0, None, True) == (None, None)
    assert first.step(up, other, 10.0, None, True) == (None, None)  # over: go alone
    assert other.first is None
    assert first.settled(up)


class _Fleet:
    """No Redis: ``Shared`` only needs something to name as its fleet here."""


def test_what_the_others_wait_on_is_sent_again_once_redis_answers() -> None:
    shared = Shared(_Fleet(), FleetPolicy(), "g", RetryBudgetPolicy())
    up = SimpleNamespace(
        name=UP, quota=SimpleNamespace(learn=True, learnt=False, buckets={}, shared=True)
    )
    probed = FleetOp("probed", (UP, {}, PROBED_TTL_S))
    shared.ran(probed, None)  # Redis did not answer it
    shared.ran(FleetOp("refund", (UP, [])), None)  # an accounting op: not repeated
    shared.ran(FleetOp("probed", ("other", {}, 1.0)), True)  # answered
    assert list(shared.backlog) == []
    shared.apply([up], up, FleetOp("heartbeat", (UP,)), 2, 0.0)
    assert list(shared.backlog) == [probed]
    shared.backlog.clear()
    shared.apply([up], up, FleetOp("heartbeat", (UP,)), 2, 1.0)
    assert list(shared.backlog) == []  # once

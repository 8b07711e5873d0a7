"""A hint longer than what is left of the call (issue 40, defect 2): Azure's "retry after
86400 seconds", or a hostile ``retry-after``, was capped at ``max_hint_s`` (120 s)
before it was compared with the deadline, so the call waited until its deadline, retried
and failed there, holding every caller behind it. It fails at once now, with the hint
in the error."""

from __future__ import annotations

import time

import pytest

from yieldgate import (
    CallFailedError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    Outcome,
    QuotaExhaustedError,
)

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("hint_s", [86_400.0, 1e20])
async def test_a_hint_past_the_deadline_fails_the_call_at_once(hint_s: float) -> None:
    gate = Gate(GatePolicy(), name="long-hint")
    attempts = 0

    async def refused() -> Outcome:
        nonlocal attempts
        attempts += 1
        return Outcome.yielded(hint_s, "overloaded")

    with pytest.raises(DeadlineExceededError, match=r"asked to wait 86400 s") as raised:
        await gate.call(refused, timeout=3.0)
    assert attempts == 1  # on main: 2, the second at the deadline after a 2.9 s wait
    assert raised.value.last_hint_s == 86_400.0
    assert gate._core.audit() == []


@pytest.mark.parametrize("reason", ["rate_limited", "daily_quota"])
async def test_a_quota_whose_reset_is_past_the_deadline_is_exhausted(reason: str) -> None:
    """A provider's quota refusal: the hint is when it refills, named in the error."""
    gate = Gate(GatePolicy(), name="long-quota")
    attempts = 0

    async def refused() -> Outcome:
        nonlocal attempts
        attempts += 1
        return Outcome.yielded(86_400.0, reason)

    before = time.time()
    with pytest.raises(QuotaExhaustedError, match=r"spent until \d{4}-") as raised:
        await gate.call(refused, timeout=3.0)
    assert attempts == 1
    assert isinstance(raised.value, CallFailedError)
    assert (raised.value.reset_s, raised.value.reason) == (86_400.0, reason)
    assert raised.value.reset_at is not None
    assert before + 86_400 <= raised.value.reset_at <= time.time() + 86_400
    assert gate._core.audit() == []


async def test_a_hint_within_the_deadline_is_still_waited_for() -> None:
    gate = Gate(GatePolicy(), name="short-hint")
    answers = [Outcome.yielded(0.05, "rate_limited"), Outcome.ok("served")]

    async def once_refused() -> Outcome:
        return answers.pop(0)

    assert await gate.call(once_refused, timeout=3.0) == "served"

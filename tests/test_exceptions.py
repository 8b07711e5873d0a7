"""The exception tree: one root, the ways a Gate gives up, timeouts that are TimeoutErrors."""

from __future__ import annotations

import pickle
from typing import Any

import anyio
import pytest

import yieldgate
from tests.vtime import VirtualTimeLoop
from yieldgate import (
    AttemptTimeoutError,
    CallFailedError,
    CircuitOpenError,
    DeadlineExceededError,
    Gate,
    GatePolicy,
    GaveUpError,
    Outcome,
    RemoteError,
    RetriesExhaustedError,
    RetryBudgetExhaustedError,
    RetryPolicy,
    StreamInterruptedError,
    TimeoutPolicy,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate.dialects import ResponseFormatError
from yieldgate.protocol import FrameError, IntegrityError, ProtocolError

GIVING_UP = [
    RetriesExhaustedError,
    YieldExhaustedError,
    RetryBudgetExhaustedError,
    CircuitOpenError,
    DeadlineExceededError,
]


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    return ("asyncio", {"loop_factory": VirtualTimeLoop})


def test_every_error_is_a_yieldgate_error() -> None:
    # But the one about the installation, not a call: an ImportError, as pip users expect.
    errors = [getattr(yieldgate, name) for name in yieldgate.__all__ if name.endswith("Error")]
    errors.remove(yieldgate.MissingExtraError)
    errors += [FrameError, IntegrityError, ProtocolError, ResponseFormatError]
    assert all(issubclass(error, YieldgateError) for error in errors)
    assert issubclass(yieldgate.MissingExtraError, ImportError)


@pytest.mark.parametrize("error", GIVING_UP)
def test_the_five_ways_of_giving_up_are_gave_up_errors(error: type[YieldgateError]) -> None:
    assert issubclass(error, GaveUpError)


def test_a_fatal_outcome_is_not_giving_up() -> None:
    assert not issubclass(CallFailedError, GaveUpError)
    assert not issubclass(GaveUpError, CallFailedError)


def test_the_protocol_errors_share_one_base() -> None:
    assert issubclass(FrameError, ProtocolError)
    assert issubclass(IntegrityError, ProtocolError)
    # The upstream's error answer and the HTTP body shapes are not the protocol's.
    assert not issubclass(RemoteError, ProtocolError)
    assert not issubclass(ResponseFormatError, ProtocolError)


def test_timeouts_are_timeout_errors_and_nothing_else_is() -> None:
    timeouts = [DeadlineExceededError, AttemptTimeoutError]
    assert all(issubclass(error, TimeoutError) for error in timeouts)
    others = [getattr(yieldgate, name) for name in yieldgate.__all__ if name.endswith("Error")]
    assert [e for e in others if issubclass(e, TimeoutError) and e not in timeouts] == []
    error = DeadlineExceededError("out of time", attempts=3, last_hint_s=1.5)
    assert (str(error), error.attempts, error.last_hint_s) == ("out of time", 3, 1.5)
    assert error.errno is None  # an OSError's fields, unset


@pytest.mark.anyio
async def test_a_deadline_is_caught_as_a_timeout_error() -> None:
    async def busy() -> Outcome:
        return Outcome.yielded(10.0, "saturated")

    gate = Gate(name="busy")
    with pytest.raises(TimeoutError) as caught:
        await gate.call(busy, timeout=2.0)
    assert isinstance(caught.value, DeadlineExceededError)
    assert isinstance(caught.value, GaveUpError)
    assert caught.value.last_hint_s == 10.0


@pytest.mark.anyio
async def test_an_attempt_timeout_is_a_timeout_error() -> None:
    async def stuck() -> None:
        await anyio.sleep_forever()

    policy = GatePolicy(
        retry=RetryPolicy(max_attempts=2), timeout=TimeoutPolicy(attempt_s=1.0, total_s=60.0)
    )
    gate = Gate(policy, name="stuck")
    with pytest.raises(GaveUpError) as caught:
        await gate.call(stuck)
    assert isinstance(caught.value, RetriesExhaustedError)
    cause = caught.value.__cause__
    assert isinstance(cause, AttemptTimeoutError)
    with pytest.raises(TimeoutError):
        raise cause


def _examples() -> list[YieldgateError]:
    kw: dict[str, Any] = {"attempts": 2, "last_hint_s": 0.5, "last_outcome": "the last"}
    return [
        YieldgateError("base", **kw),
        CallFailedError("fatal", **kw),
        RetriesExhaustedError("retries", **kw),
        YieldExhaustedError("yields", **kw),
        RetryBudgetExhaustedError("budget", **kw),
        CircuitOpenError("open", retry_after_s=3.0, **kw),
        DeadlineExceededError("deadline", **kw),
        AttemptTimeoutError("attempt", **kw),
        StreamInterruptedError("cut", chunks=[b"a", b"b"], **kw),
        RemoteError("remote", code="backend_error", retryable=True, **kw),
        ResponseFormatError("shape", excerpt="<html>", **kw),
        ProtocolError("protocol"),
        FrameError("bad_frame", "not JSON", request_id="r1"),
        IntegrityError("sha"),
    ]


@pytest.mark.parametrize("error", _examples(), ids=lambda e: type(e).__name__)
def test_errors_survive_pickling_with_their_fields(error: YieldgateError) -> None:
    # What crosses a process boundary (multiprocessing, concurrent.futures) is pickled.
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert (str(copy), copy.args) == (str(error), error.args)
    assert copy.__dict__ == error.__dict__

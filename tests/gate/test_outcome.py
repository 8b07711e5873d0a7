"""Outcomes and the default classification."""

from __future__ import annotations

import errno
import socket

import httpx
import pytest

from yieldgate import (
    AttemptTimeoutError,
    DeadlineExceededError,
    Outcome,
    RemoteError,
    RetriesExhaustedError,
    TransportError,
)
from yieldgate.gate import OutcomeKind, default_classify
from yieldgate.gate._outcome import MAX_HINT_S, sanitize_hint_s


def test_values_are_ok_and_outcomes_pass_through() -> None:
    assert default_classify(42, None) == Outcome.ok(42)
    yielded = Outcome.yielded(0.5, "saturated")
    assert default_classify(yielded, None) is yielded


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (TransportError("reset"), OutcomeKind.RETRYABLE),
        (AttemptTimeoutError("slow"), OutcomeKind.RETRYABLE),
        (ConnectionResetError(), OutcomeKind.RETRYABLE),
        (TimeoutError(), OutcomeKind.RETRYABLE),
        (httpx.ConnectError("refused"), OutcomeKind.RETRYABLE),
        (RemoteError("x", code="backend_error", retryable=True), OutcomeKind.RETRYABLE),
        (RemoteError("x", code="unauthorized", retryable=False), OutcomeKind.FATAL),
        (ValueError("bad input"), OutcomeKind.FATAL),
        (KeyError("k"), OutcomeKind.FATAL),
        # An inner Gate that gave up spent its retries: a deadline is a TimeoutError
        # too, but no more retryable than the others.
        (DeadlineExceededError("late"), OutcomeKind.FATAL),
        (RetriesExhaustedError("spent"), OutcomeKind.FATAL),
    ],
)
def test_errors(error: BaseException, kind: OutcomeKind) -> None:
    outcome = default_classify(None, error)
    assert outcome.kind is kind
    assert outcome.error is error


def test_congestion_kinds() -> None:
    assert Outcome.yielded(1.0).is_congestion
    assert Outcome.overloaded().is_congestion
    assert not Outcome.retryable().is_congestion


@pytest.mark.parametrize(
    ("hint", "expected"),
    [
        (-1.0, None),
        (float("nan"), None),
        (float("inf"), None),
        (1e8, MAX_HINT_S),
        (10**400, MAX_HINT_S),
        (0.25, 0.25),
        (0, 0.0),
    ],
)
def test_an_absurd_hint_is_dropped_or_clamped_never_raised(
    hint: float, expected: float | None
) -> None:
    # Issue 16 item 6: a negative hint raised ValueError, a huge integer OverflowError.
    outcome = Outcome.yielded(hint)
    assert outcome.hint_s == expected
    assert outcome.kind is OutcomeKind.YIELD


@pytest.mark.parametrize(
    ("value", "unit_s", "expected"),
    [
        (10**400, 0.001, MAX_HINT_S),  # a governed retry_hint_ms of 10^400
        (1e12, 0.001, MAX_HINT_S),  # a governed-http retry_hint_ms of 1e12
        (1500, 0.001, 1.5),
        (True, 1.0, None),
        ("3", 1.0, None),
        (None, 1.0, None),
        (-0.5, 1.0, None),
    ],
)
def test_sanitize_hint_s(value: object, unit_s: float, expected: float | None) -> None:
    assert sanitize_hint_s(value, unit_s=unit_s) == expected


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (FileNotFoundError(2, "no such file"), OutcomeKind.FATAL),
        (PermissionError(13, "denied"), OutcomeKind.FATAL),
        (IsADirectoryError(21, "is a directory"), OutcomeKind.FATAL),
        (OSError(errno.ENOSPC, "no space"), OutcomeKind.FATAL),
        (socket.gaierror(socket.EAI_NONAME, "unknown host"), OutcomeKind.FATAL),
        (socket.gaierror(socket.EAI_AGAIN, "try again"), OutcomeKind.RETRYABLE),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), OutcomeKind.RETRYABLE),
        (BrokenPipeError(errno.EPIPE, "broken pipe"), OutcomeKind.RETRYABLE),
        (OSError(errno.EHOSTUNREACH, "no route"), OutcomeKind.RETRYABLE),
        (OSError(errno.ENETUNREACH, "network unreachable"), OutcomeKind.RETRYABLE),
    ],
)
def test_only_network_oserrors_are_retryable(error: OSError, kind: OutcomeKind) -> None:
    # Issue 16 item 10: any OSError was retried, a missing file or a denied permission too.
    assert default_classify(None, error).kind is kind


def test_describe() -> None:
    text = Outcome.yielded(0.25, "cold_start").describe()
    assert text == "yield, cold_start, hint 250 ms"
    assert "ValueError: nope" in Outcome.fatal(ValueError("nope")).describe()

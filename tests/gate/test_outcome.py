"""Outcomes and the default classification."""

from __future__ import annotations

import httpx
import pytest

from yieldgate import (
    AttemptTimeoutError,
    Outcome,
    RemoteError,
    TransportError,
)
from yieldgate.gate import OutcomeKind, default_classify


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


def test_hint_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="hint_s"):
        Outcome.yielded(-1.0)


def test_describe() -> None:
    text = Outcome.yielded(0.25, "cold_start").describe()
    assert text == "yield, cold_start, hint 250 ms"
    assert "ValueError: nope" in Outcome.fatal(ValueError("nope")).describe()

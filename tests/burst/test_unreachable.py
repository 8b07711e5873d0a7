"""An unreachable target, told apart from one that answers badly, whatever wraps the cause."""

from __future__ import annotations

import errno
import socket

import pytest

import yieldgate
from yieldgate.burst._targets import error_kind
from yieldgate.burst._unreachable import unreachable_line, unreachable_reason


def _wrapped(cause: BaseException) -> BaseException:
    """``cause`` as the governed client and the Gate hand it on."""
    try:
        try:
            raise cause
        except OSError as exc:
            raise yieldgate.TransportError(f"cannot connect to tcp://h:1: {exc}") from exc
    except yieldgate.TransportError as exc:
        try:
            raise yieldgate.RetriesExhaustedError("gave up", attempts=4) from exc
        except yieldgate.RetriesExhaustedError as final:
            return final


def test_a_refused_connection_behind_the_gates_verdict() -> None:
    error = _wrapped(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
    assert unreachable_reason(error) == "connection refused"
    assert error_kind(error) == "unreachable"
    assert unreachable_line(error, "127.0.0.1", 1) == "connection refused to 127.0.0.1:1"


def test_a_name_that_does_not_resolve() -> None:
    error = _wrapped(socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    assert unreachable_line(error, "nowhere.invalid", 80) == "cannot resolve nowhere.invalid"


def test_a_connect_time_out_of_the_governed_client() -> None:
    error = yieldgate.TransportError(
        "cannot connect to tcp://10.0.0.1:7070: no connection within connect_timeout=10 s"
    )
    assert unreachable_line(error, "10.0.0.1", 7070) == "connection to 10.0.0.1:7070 timed out"


def test_the_breakers_verdict_on_a_refused_attempt_keeps_the_cause() -> None:
    refused = _wrapped(ConnectionRefusedError(errno.ECONNREFUSED, "refused")).__cause__
    assert refused is not None
    outcome = type("Outcome", (), {"error": refused})()
    opened = yieldgate.CircuitOpenError("circuit opened while retrying", last_outcome=outcome)
    assert error_kind(opened) == "unreachable"


def test_answers_are_not_unreachable() -> None:
    assert unreachable_reason(yieldgate.CircuitOpenError("circuit open")) is None
    assert error_kind(yieldgate.CircuitOpenError("circuit open")) == "CircuitOpenError"
    assert error_kind(yieldgate.YieldExhaustedError("busy")) == "YieldExhaustedError"
    lost = yieldgate.TransportError("connection closed by the server")
    assert error_kind(lost) == "TransportError"


def test_a_read_time_out_through_openai_is_not_unreachable() -> None:
    # openai raises APITimeoutError (an APIConnectionError) for a read time-out too: the
    # server was reached, it was slow. Only httpx's ConnectTimeout behind it means unreachable.
    openai = pytest.importorskip("openai")
    httpx = pytest.importorskip("httpx")
    request = httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions")

    def wrapped(cause: BaseException) -> BaseException:
        try:
            raise openai.APITimeoutError(request=request) from cause
        except openai.APITimeoutError as exc:
            return exc

    assert unreachable_reason(wrapped(httpx.ReadTimeout("read", request=request))) is None
    connect = httpx.ConnectTimeout("connect", request=request)
    assert unreachable_reason(wrapped(connect)) == "connect timed out"

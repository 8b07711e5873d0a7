"""Outcomes: what one attempt came to, the only thing the Gate reasons about.

An attempt function returns a value (``ok``), returns an ``Outcome`` itself,
or raises; a classifier turns the last two cases into an Outcome. The kinds:

- ``ok``: done, return the value.
- ``yield``: the upstream declined *before doing any work* and said when to come
  back. A congestion signal: shrink the window, wait about the hint. Never a
  failure: it trips no breaker and spends no retry budget.
- ``overloaded``: the upstream shed the request (an HTTP 503 and kin), perhaps
  with a hint. Congestion too, but it may have cost the upstream something, so
  its retries spend the retry budget.
- ``retryable``: a failure that may pass on another attempt (a reset, a timeout,
  a 5xx). Counts against the breaker and spends the retry budget.
- ``fatal``: a failure another attempt will not fix (a 400, bad auth). Raised at
  once; not counted against the breaker, which guards the upstream's health,
  not the caller's mistakes.
"""

from __future__ import annotations

import errno
import math
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final

from yieldgate._exceptions import (
    AttemptTimeoutError,
    GaveUpError,
    RemoteError,
    TransportError,
)

__all__ = [
    "MAX_HINT_S",
    "Classifier",
    "Outcome",
    "OutcomeKind",
    "OutcomeSignal",
    "callable_name",
    "checked",
    "default_classify",
    "sanitize_hint_s",
]

MAX_HINT_S: Final = 86_400.0
"""The longest hint kept as such (a day); longer ones are clamped to it, and the
Gate clamps again to its policy's ``max_hint_s``."""


def sanitize_hint_s(value: object, *, unit_s: float = 1.0) -> float | None:
    """A retry hint as the Gate can use it, from whatever an upstream sent.

    ``value`` is a number of ``unit_s`` (``0.001`` for milliseconds). The one
    rule for every dialect: a negative, non-finite or non-numeric value (a
    bool included) is no hint at all, and a huge one is clamped to
    ``MAX_HINT_S``. It never raises: an absurd hint must not turn a yield into
    a crash.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        seconds = value * unit_s
    except OverflowError:  # an integer too large for a float: finite, and huge
        return MAX_HINT_S if value > 0 else None
    if not (seconds >= 0 and math.isfinite(seconds)):
        return None
    return min(float(seconds), MAX_HINT_S)


class OutcomeKind(StrEnum):
    """The five things an attempt can come to (the module docstring says what each does)."""

    OK = "ok"
    """Done: the call returns the value."""
    YIELD = "yield"
    """Declined before any work, with a hint: congestion, never a failure."""
    OVERLOADED = "overloaded"
    """Shed (an HTTP 503 and kin): congestion that may have cost the upstream work."""
    RETRYABLE = "retryable"
    """A failure that may pass on another attempt: counts against the breaker."""
    FATAL = "fatal"
    """A failure another attempt will not fix (a 400, bad auth): raised at once."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """One attempt's result, as the Gate sees it.

    ``hint_s`` is the upstream's own retry hint in seconds (``None`` when it
    gave none); a negative or non-finite one is dropped and a huge one clamped
    (``sanitize_hint_s``). ``value`` carries the raw reply for non-``ok`` kinds too (an
    HTTP response, say), so that a caller can still see it when retries run
    out. ``error`` is the exception behind a failure, if there was one.
    """

    kind: OutcomeKind
    """What the attempt came to."""
    value: Any = None
    """The attempt's value, or for the other kinds the raw reply (an HTTP response)."""
    hint_s: float | None = None
    """The upstream's retry hint, in seconds; ``None``: it gave none."""
    reason: str | None = None
    """Why, in a word (a yield's ``saturated``, ``cold_start``, ``slo``), if known."""
    error: BaseException | None = None
    """The exception behind a failure, if there was one."""

    def __post_init__(self) -> None:
        if self.hint_s is not None:
            # Whatever built it, a hint the Gate acts on is sane (see sanitize_hint_s).
            object.__setattr__(self, "hint_s", sanitize_hint_s(self.hint_s))

    @classmethod
    def ok(cls, value: Any = None) -> Outcome:
        """Done: the call returns ``value``."""
        # Built for every successful attempt: skip the dataclass __init__ and
        # its hint check (an ok carries no hint).
        outcome = object.__new__(cls)
        _set_kind(outcome, OutcomeKind.OK)
        _set_value(outcome, value)
        _set_hint(outcome, None)
        _set_reason(outcome, None)
        _set_error(outcome, None)
        return outcome

    @classmethod
    def yielded(
        cls, hint_s: float | None, reason: str = "saturated", *, value: Any = None
    ) -> Outcome:
        """Declined before any work; come back in about ``hint_s`` seconds."""
        return cls(OutcomeKind.YIELD, value, hint_s, reason)

    @classmethod
    def overloaded(
        cls,
        hint_s: float | None = None,
        *,
        reason: str | None = None,
        value: Any = None,
        error: BaseException | None = None,
    ) -> Outcome:
        """Shed under load (an HTTP 503 and kin), perhaps with a hint."""
        return cls(OutcomeKind.OVERLOADED, value, hint_s, reason, error)

    @classmethod
    def retryable(
        cls,
        error: BaseException | None = None,
        *,
        hint_s: float | None = None,
        reason: str | None = None,
        value: Any = None,
    ) -> Outcome:
        """A failure that may pass on another attempt (a reset, a timeout, a 5xx)."""
        return cls(OutcomeKind.RETRYABLE, value, hint_s, reason, error)

    @classmethod
    def fatal(
        cls, error: BaseException | None = None, *, reason: str | None = None, value: Any = None
    ) -> Outcome:
        """A failure another attempt will not fix: the call raises it at once."""
        return cls(OutcomeKind.FATAL, value, None, reason, error)

    @property
    def is_congestion(self) -> bool:
        """A yield or an overload: the upstream is full, not broken."""
        return self.kind is OutcomeKind.YIELD or self.kind is OutcomeKind.OVERLOADED

    def describe(self) -> str:
        """The outcome in a few words, for messages and logs: ``yield, saturated, hint 250 ms``."""
        parts = [str(self.kind)]
        if self.reason:
            parts.append(self.reason)
        if self.hint_s is not None:
            parts.append(f"hint {self.hint_s * 1000:.0f} ms")
        if self.error is not None:
            parts.append(f"{type(self.error).__name__}: {self.error}")
        return ", ".join(parts)


def _setter(name: str) -> Callable[[Outcome, Any], None]:
    setter: Callable[[Outcome, Any], None] = vars(Outcome)[name].__set__
    return setter


# The slots of a frozen Outcome, set directly: ``Outcome.ok`` runs for every success.
_set_kind = _setter("kind")
_set_value = _setter("value")
_set_hint = _setter("hint_s")
_set_reason = _setter("reason")
_set_error = _setter("error")


class OutcomeSignal(Exception):
    """Carries a non-ok Outcome out of a call nested in an attempt of the same Gate.

    When ``fn`` itself calls through the Gate that is running it (say,
    ``gate.map(client.submit, ...)``, where ``submit`` already uses ``gate``),
    the inner call runs as part of the outer attempt, and its yield or failure
    is raised as this signal for the outer attempt to classify. A custom
    classifier should hand exceptions it does not know to ``default_classify``.
    """

    def __init__(self, outcome: Outcome) -> None:
        super().__init__(outcome.describe())
        self.outcome = outcome
        """The inner call's Outcome, for the outer attempt's classifier."""


Classifier = Callable[[Any, BaseException | None], Outcome]
"""``classify(value, error)``: exactly one of the two is meaningful (``error`` is
``None`` when the attempt returned)."""


def _is_httpx_transport_error(error: BaseException) -> bool:
    # httpx is a core dependency, but the gate never imports it eagerly: only
    # when the caller's code already did is the check meaningful. A URL the
    # library cannot send, or a request it refuses to write, fails the same
    # way on every attempt: those are not retryable.
    for name in ("httpx", "httpx2"):
        module = sys.modules.get(name)
        if module is not None and isinstance(error, module.TransportError):
            return not isinstance(error, module.UnsupportedProtocol | module.LocalProtocolError)
    return False


# OSErrors that say "the network or the peer", not "this machine or this request".
_NETWORK_ERRNOS: Final = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNREFUSED",
        "ECONNRESET",
        "ECONNABORTED",
        "EPIPE",
        "ETIMEDOUT",
        "EHOSTUNREACH",
        "EHOSTDOWN",
        "ENETUNREACH",
        "ENETDOWN",
        "ENETRESET",
        "EAGAIN",
        "EADDRNOTAVAIL",
    )
    if hasattr(errno, name)
)


def _is_network_error(error: OSError) -> bool:
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    if isinstance(error, socket.gaierror):
        # A name that does not resolve stays unresolved; a resolver that
        # failed for now may answer on the next attempt.
        return error.errno == socket.EAI_AGAIN
    return error.errno in _NETWORK_ERRNOS


def default_classify(value: Any, error: BaseException | None) -> Outcome:
    """The classification used when a call names none.

    A returned ``Outcome`` is taken as is, any other value is ``ok``; an
    ``OutcomeSignal`` gives its outcome. Errors:
    yieldgate's own transport and timeout errors, network ``OSError``s
    (connection refused or reset, a host or network unreachable, a resolver
    that failed for now), ``TimeoutError`` and httpx (or httpx2) transport
    errors are ``retryable``, except an unsupported protocol or a request the
    library refuses to write; a ``RemoteError`` is as retryable as the server
    said; an AWS SDK's (botocore's) ``ClientError`` by its code (throttling is a
    ``yield``, see ``_aws_outcome``); a ``GaveUpError`` (another Gate inside the
    attempt gave up, after its own retries) and anything else is ``fatal``: a
    ``FileNotFoundError`` or a ``PermissionError`` fails the same way on every
    attempt.
    """
    if error is None:
        return value if isinstance(value, Outcome) else Outcome.ok(value)
    if isinstance(error, OutcomeSignal):
        return error.outcome
    if isinstance(error, GaveUpError):
        # Another Gate inside this attempt gave up (a deadline is also a
        # TimeoutError): its own retries are spent, so this attempt's fails.
        return Outcome.fatal(error)
    if isinstance(error, TransportError | AttemptTimeoutError | TimeoutError):
        return Outcome.retryable(error)
    if isinstance(error, OSError):
        return Outcome.retryable(error) if _is_network_error(error) else Outcome.fatal(error)
    if isinstance(error, RemoteError):
        return Outcome.retryable(error) if error.retryable else Outcome.fatal(error)
    if _is_httpx_transport_error(error):
        return Outcome.retryable(error)
    return _aws_outcome(error) or Outcome.fatal(error)


def plain_success(outcome: Outcome) -> bool:
    """A success with nothing more to say (no reason, no error): most attempts'. The
    Gate ends it without asking ``judge`` (``CallState.end``, the express lane)."""
    return outcome.kind is OutcomeKind.OK and outcome.error is None and outcome.reason is None


def checked(classify: Classifier, value: Any, error: BaseException | None) -> Outcome:
    """``classify(value, error)``, which must be an ``Outcome``: anything else is a
    ``TypeError`` (raised to the caller once the attempt's ledger is closed)."""
    outcome = classify(value, error)
    if type(outcome) is Outcome or isinstance(outcome, Outcome):
        return outcome
    raise TypeError(
        f"a classifier must return an Outcome, but {callable_name(classify)} returned "
        f"{type(outcome).__name__} {outcome!r:.80}"
    ) from error


def callable_name(fn: Any) -> str:
    """How a message names a function the user handed over."""
    return getattr(fn, "__qualname__", None) or type(fn).__name__


# An AWS SDK's errors: boto3 clients (Bedrock's ``converse`` and ``invoke_model`` among
# them) raise botocore's ``ClientError`` for every refusal, with no ``status_code``: the
# code is in ``error.response["Error"]["Code"]``. Read by name (nothing imports botocore):
# throttling is a ``yield``, ``rate_limited`` (a ``Retry-After`` header's hint when the
# response carries one); ``ServiceUnavailableException`` ``overloaded``;
# ``ModelNotReadyException`` (a Bedrock model being loaded) a ``cold_start`` yield; model
# timeouts and internal errors ``retryable``; any other code (validation, access, an
# account's quota) is left to the rest of ``default_classify`` (``fatal``).
_YIELDS: Final = {
    "ThrottlingException": "rate_limited",
    "TooManyRequestsException": "rate_limited",
    "Throttling": "rate_limited",
    "RequestLimitExceeded": "rate_limited",
    "ProvisionedThroughputExceededException": "rate_limited",
    "ModelNotReadyException": "cold_start",
}
_RETRYABLE: Final = frozenset(
    {"ModelTimeoutException", "InternalServerException", "InternalFailure"}
)


def _is_client_error(error: BaseException) -> bool:
    return any(
        cls.__name__ == "ClientError" and cls.__module__.startswith("botocore")
        for cls in type(error).__mro__
    )


def _aws_outcome(error: BaseException) -> Outcome | None:
    """The outcome of a botocore ``ClientError`` (see the module docstring), or ``None``."""
    if not _is_client_error(error):
        return None
    response: Any = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    code = (response.get("Error") or {}).get("Code")
    headers = (response.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    hint = None
    if isinstance(headers, dict):
        retry_after = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if retry_after is not None:
            try:
                hint = sanitize_hint_s(float(retry_after))
            except (TypeError, ValueError):
                hint = None
    if code in _YIELDS:
        return Outcome(OutcomeKind.YIELD, None, hint, _YIELDS[code], error)
    if code == "ServiceUnavailableException":
        return Outcome.overloaded(hint, reason="unavailable", error=error)
    if code in _RETRYABLE:
        return Outcome.retryable(error, hint_s=hint, reason=code)
    return None

"""The exception tree of yieldgate.

Every error yieldgate raises to its users is a ``YieldgateError``; no
dependency's exception type escapes the public API::

    YieldgateError                  .attempts, .last_hint_s, .last_outcome
     ├── GateClosedError            the Gate or client was used after aclose()
     ├── CallFailedError            an attempt failed in a way retrying cannot fix
     ├── RetriesExhaustedError      failures kept coming until max_attempts
     ├── YieldExhaustedError        the upstream kept yielding until max_yields
     ├── RetryBudgetExhaustedError  a retry was due, but the retry budget was spent
     ├── CircuitOpenError           the breaker is open: this attempt was not sent
     ├── DeadlineExceededError      the call's total time ran out (or would have)
     ├── AttemptTimeoutError        one attempt ran past its timeout (retryable)
     ├── TransportError             the connection failed or broke (retryable)
     ├── StreamInterruptedError     a stream failed after its first chunk (.chunks)
     ├── RemoteError                the server answered an error (.code, .retryable)
     ├── ProtocolError              a peer broke the governed protocol (PROTOCOL.md)
     │    ├── FrameError            one frame could not be decoded or failed validation
     │    └── IntegrityError        a body kept failing its SHA-256 check
     └── ResponseFormatError        an HTTP body had none of the shapes its dialect knows

This module imports only the standard library, so that the protocol module
(shared by the server and the client) can raise these types.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AttemptTimeoutError",
    "CallFailedError",
    "CircuitOpenError",
    "DeadlineExceededError",
    "FrameError",
    "GateClosedError",
    "IntegrityError",
    "ProtocolError",
    "RemoteError",
    "ResponseFormatError",
    "RetriesExhaustedError",
    "RetryBudgetExhaustedError",
    "StreamInterruptedError",
    "TransportError",
    "YieldExhaustedError",
    "YieldgateError",
]


class YieldgateError(Exception):
    """Base class of every error that yieldgate raises.

    ``attempts`` is how many attempts the call made (0 if none), ``last_hint_s``
    the last retry hint the upstream gave, in seconds, and ``last_outcome`` the
    Outcome of the last attempt, when there was one. The underlying error, if
    any, is ``__cause__``.
    """

    def __init__(
        self,
        message: str,
        *,
        attempts: int = 0,
        last_hint_s: float | None = None,
        last_outcome: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.attempts = attempts
        self.last_hint_s = last_hint_s
        self.last_outcome = last_outcome


class GateClosedError(YieldgateError):
    """The Gate (or a client holding one) was used after ``aclose()``."""


class CallFailedError(YieldgateError):
    """An attempt failed with an error that retrying cannot fix (a fatal Outcome)."""


class RetriesExhaustedError(YieldgateError):
    """Retryable failures continued until the policy's ``max_attempts``."""


class YieldExhaustedError(YieldgateError):
    """The upstream kept yielding (or answering overloaded) until ``max_yields``."""


class RetryBudgetExhaustedError(YieldgateError):
    """A retry was due but the retry budget was spent: retrying now would amplify an outage."""


class CircuitOpenError(YieldgateError):
    """The circuit breaker is open (or its single probe is out): the attempt was not sent.

    Raised before the first attempt, or in place of a retry (``attempts`` then
    counts the attempts made before). ``retry_after_s`` says when the breaker
    will let a probe through (``None`` while another caller's probe is out).
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s


class DeadlineExceededError(YieldgateError):
    """The call's total time budget ran out, or the next wait would have overrun it."""


class AttemptTimeoutError(YieldgateError):
    """One attempt ran past its per-attempt timeout. Retryable."""


class TransportError(YieldgateError):
    """The connection could not be made, or broke mid-request. Retryable."""


class StreamInterruptedError(YieldgateError):
    """A stream failed after its first chunk had been delivered: the commit point.

    Before the first chunk, a stream is retried (or hedged) like any call;
    after it, trying again would repeat output the caller has already seen,
    so the failure is raised instead. ``chunks`` holds what arrived before it
    (the chunks' ``data`` for the governed protocol, raw body bytes for HTTP);
    ``__cause__`` is the failure itself (a ``TransportError``, a
    ``RemoteError``, the HTTP library's read error).
    """

    def __init__(self, message: str, *, chunks: list[Any], **kw: Any) -> None:
        super().__init__(message, **kw)
        self.chunks = chunks


class RemoteError(YieldgateError):
    """The server answered an ``error``: ``code`` and ``retryable`` are as it sent them."""

    def __init__(self, message: str, *, code: str, retryable: bool, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.code = code
        self.retryable = retryable


class ProtocolError(YieldgateError):
    """A peer sent something the governed protocol does not allow."""


class FrameError(ProtocolError):
    """One frame was rejected.

    ``code`` is the protocol's error code (``bad_frame``, ``frame_too_large``,
    ``integrity_mismatch``, ``unknown_op``, ``unauthorized``) and
    ``request_id`` the frame's ``id`` when one could be read, else ``None``.
    """

    def __init__(self, code: str, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"FrameError(code={self.code!r}, message={self.message!r}, id={self.request_id!r})"


class IntegrityError(ProtocolError):
    """A body's SHA-256 did not match on arrival, again and again."""


class ResponseFormatError(YieldgateError):
    """An HTTP response body had none of the shapes its dialect knows.

    ``excerpt`` holds the start of the body (at most 200 characters), for the
    log line that will be written about it.
    """

    def __init__(self, message: str, *, excerpt: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.excerpt = excerpt

"""The exception tree of yieldgate.

Every error yieldgate raises to its users is a ``YieldgateError``; no
dependency's exception type escapes the public API::

    YieldgateError                  .attempts, .last_hint_s, .last_outcome
     ├── GateClosedError            the Gate or client was used after aclose()
     ├── BlockingCallError          a sync call from a thread that runs an event loop
     ├── FleetConfigError           Redis refused a shared Gate's credentials or commands
     ├── CallFailedError            an attempt failed in a way retrying cannot fix
     │    ├── RequestTooLargeError       its cost exceeds a whole quota: no wait helps
     │    └── QuotaExhaustedError        a daily quota spent, or a reset past the deadline
     ├── GaveUpError                the Gate stopped trying; a later call may succeed
     │    ├── RetriesExhaustedError      failures kept coming until max_attempts
     │    ├── YieldExhaustedError        the upstream kept yielding until max_yields
     │    ├── RetryBudgetExhaustedError  a retry was due, but the retry budget was spent
     │    ├── CircuitOpenError           the breaker is open: this attempt was not sent
     │    └── DeadlineExceededError      the call's total time ran out (a TimeoutError too)
     ├── AttemptTimeoutError        one attempt ran past its timeout (retryable; a TimeoutError too)
     ├── TransportError             the connection failed or broke (retryable)
     ├── StreamInterruptedError     a stream failed after its first chunk (.chunks)
     ├── RemoteError                the server answered an error (.code, .retryable)
     ├── ResponseFormatError        an HTTP body had none of the shapes its dialect knows
     ├── ServerStartError           yieldgate.server.spawn: the server did not start (.stderr)
     ├── HubClientsInUseError       huggingface_clients: another thread's block is active
     └── ProtocolError              a peer broke the governed protocol (PROTOCOL.md)
          ├── FrameError            one frame could not be decoded or failed validation
          └── IntegrityError        a body kept failing its SHA-256 check

``CallFailedError`` is not a ``GaveUpError``: the Gate did not stop, the
answer was final (a 400, a request the server refused, an error in the
attempt function), and the same call would fail the same way again. A
``GaveUpError`` means a limit of the Gate's own ran out while the upstream
was busy, broken or slow; the same call may succeed later, and
``last_hint_s`` says when the upstream last asked to be called back.

The two timeout errors are also the builtin ``TimeoutError``, so code that
already handles timeouts (``except TimeoutError``) handles a Gate's.

``yieldgate`` exports the errors a caller catches; the governed protocol's
(``ProtocolError`` and its subclasses) are exported from ``yieldgate.protocol``
``ResponseFormatError`` from ``yieldgate.dialects``, ``ServerStartError``
from ``yieldgate.server`` and ``HubClientsInUseError`` (also a
``RuntimeError``) from ``yieldgate.transports``. This module imports
only the standard library, so that the protocol module (shared by the server
and the client) can raise these types.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "AttemptTimeoutError",
    "BlockingCallError",
    "CallFailedError",
    "CircuitOpenError",
    "DeadlineExceededError",
    "FleetConfigError",
    "FrameError",
    "GateClosedError",
    "GaveUpError",
    "IntegrityError",
    "ProtocolError",
    "QuotaExhaustedError",
    "RemoteError",
    "RequestTooLargeError",
    "ResponseFormatError",
    "RetriesExhaustedError",
    "RetryBudgetExhaustedError",
    "StreamInterruptedError",
    "TransportError",
    "YieldExhaustedError",
    "YieldgateError",
]


def _rebuild(cls: type[YieldgateError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Unpickle an error without calling its ``__init__`` (whose signature is its own)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


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
        """What went wrong, in words (also ``str(error)``)."""
        self.attempts = attempts
        """How many attempts the call made (0 if none)."""
        self.last_hint_s = last_hint_s
        """The last retry hint the upstream gave, in seconds (``None``: none)."""
        self.last_outcome = last_outcome
        """The Outcome of the call's last attempt, when there was one."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default would call ``type(self)(*self.args)``, which subclasses
        # with keyword-only fields (``chunks``, ``code``) refuse.
        return _rebuild, (type(self), self.args, dict(self.__dict__))


class GateClosedError(YieldgateError):
    """The Gate (or a client holding one) was used after ``aclose()``."""


class FleetConfigError(YieldgateError):
    """A shared Gate's fleet is misconfigured: Redis refused its credentials (a wrong
    password or user) or its commands (an ACL user without ``EVALSHA``).

    Raised by calls, at their first use of the fleet, instead of going on alone
    as during an outage (``FleetPolicy(fail_open=True)`` goes on alone and warns
    again as its back-off grows). The message is Redis's, with no password.
    """


class BlockingCallError(YieldgateError, RuntimeError):
    """A sync call (``call_sync`` and kin, a sync client's request) was made from a
    thread that runs an event loop (asyncio or trio).

    Waiting there for a window slot would block the loop, and with it every
    task that could free the slot: the call would sit until its deadline.
    Await the async form (``gate.call``, the async client), or run the sync
    code in a worker thread (``asyncio.to_thread``). Pass
    ``allow_event_loop=True`` only where the call cannot wait (the Gate is
    this loop's alone, with slots to spare). Raised before anything is taken,
    in one line naming the call. Never raised in a notebook's cell (the main
    thread of an IPython shell): there a sync call blocks the cell as the plain
    clients' calls do, with one ``RuntimeWarning`` per process.
    """


class CallFailedError(YieldgateError):
    """An attempt failed with an error that retrying cannot fix (a fatal Outcome).

    Not a ``GaveUpError``: the answer was final, and the same call would fail
    the same way. The error the attempt raised (or the outcome's error, such as
    a ``RemoteError`` for a 400) is ``__cause__``.
    """


class RequestTooLargeError(CallFailedError):
    """The request costs more of a quota than the whole quota holds: no wait makes it fit.

    Raised before anything is sent when the cost exceeds a budget of the caller's
    own (``QuotaPolicy``), or when the provider answered so (``request_too_large``).
    A limit learnt from headers never raises it: a cost past it waits for the
    whole bucket and lets the provider decide. ``resource`` is what it would
    overspend (``tokens``, ``requests``, ...), ``cost`` its cost in that resource
    and ``limit`` the quota's (0 when only the provider's answer said so).
    """

    def __init__(
        self, message: str, *, resource: str = "", cost: float = 0, limit: float = 0, **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.resource = resource
        """What the request would overspend: ``tokens``, ``requests``..."""
        self.cost = cost
        """The request's cost in that resource."""
        self.limit = limit
        """The whole quota of that resource."""


class QuotaExhaustedError(CallFailedError):
    """The provider's quota is spent for longer than the call may wait: a daily (or
    monthly) quota (said by its header family or its 429's body), a billing quota,
    or a quota whose reset is past the call's deadline. Retrying within the call
    cannot help, so it fails at once rather than holding every caller behind it.

    ``reset_s`` is how long until the quota refills as the provider said it
    (``None``: it did not say), ``reset_at`` that moment on the wall clock (epoch
    seconds) and ``reason`` the outcome's (``daily_quota``, ``rate_limited``,
    ``insufficient_quota``, ``no_quota``).
    """

    def __init__(
        self,
        message: str,
        *,
        reset_s: float | None = None,
        reset_at: float | None = None,
        reason: str = "",
        **kw: Any,
    ) -> None:
        super().__init__(message, **kw)
        self.reset_s = reset_s
        """Seconds until the quota refills, as the provider said (``None``: not said)."""
        self.reset_at = reset_at
        """When it refills on the wall clock, in epoch seconds (``None``: not said)."""
        self.reason = reason
        """Why: ``daily_quota``, ``rate_limited``, ``insufficient_quota``, ``no_quota``."""


class GaveUpError(YieldgateError):
    """The Gate stopped trying before the call succeeded.

    One of its limits ran out (attempts, yields, the retry budget, the
    breaker, the total time) while the upstream was busy, broken or slow. The
    same call may succeed later: ``last_hint_s`` is the upstream's last word on
    when. Catch this to handle every way a Gate gives up at once.
    """


class RetriesExhaustedError(GaveUpError):
    """Retryable failures continued until the policy's ``max_attempts``."""


class YieldExhaustedError(GaveUpError):
    """The upstream kept yielding (or answering overloaded) until ``max_yields``."""


class RetryBudgetExhaustedError(GaveUpError):
    """A retry was due but the retry budget was spent: retrying now would amplify an outage."""


class CircuitOpenError(GaveUpError):
    """The circuit breaker is open (or its single probe is out): the attempt was not sent.

    Raised before the first attempt, or in place of a retry (``attempts`` then
    counts the attempts made before). ``retry_after_s`` says when the breaker
    will let a probe through (``None`` while another caller's probe is out).
    """

    def __init__(self, message: str, *, retry_after_s: float | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after_s = retry_after_s
        """Seconds until the breaker lets a probe through (``None``: a probe is out)."""


class DeadlineExceededError(GaveUpError, TimeoutError):
    """The call's total time budget ran out, or the next wait would have overrun it.

    Also a ``TimeoutError``: ``except TimeoutError`` catches it.
    """


class AttemptTimeoutError(YieldgateError, TimeoutError):
    """One attempt ran past its per-attempt timeout. Retryable.

    Also a ``TimeoutError``. A call whose attempts all time out raises
    ``RetriesExhaustedError`` with this as its ``__cause__``.
    """


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
        """What arrived before the failure: chunks' ``data``, or raw body bytes for HTTP."""


class RemoteError(YieldgateError):
    """The server answered an error: ``code`` and ``retryable`` are as it sent them.

    A governed server's ``error`` reply, or an HTTP error status as a dialect
    read it (``code`` is then ``http_<status>``).
    """

    def __init__(self, message: str, *, code: str, retryable: bool, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.code = code
        """The error code the server sent (``http_<status>`` for an HTTP status)."""
        self.retryable = retryable
        """Whether the server said that another attempt may succeed."""


class ResponseFormatError(YieldgateError):
    """An HTTP response body had none of the shapes its dialect knows.

    ``excerpt`` holds the start of the body (at most 200 characters), for the
    log line that will be written about it.
    """

    def __init__(self, message: str, *, excerpt: str = "", **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.excerpt = excerpt
        """The start of the body, at most 200 characters."""


class ProtocolError(YieldgateError):
    """A peer sent something the governed protocol does not allow.

    The base of the governed protocol's errors (``FrameError``,
    ``IntegrityError``), and raised itself for a reply that is not a valid
    frame. Exported from ``yieldgate.protocol``.
    """


class FrameError(ProtocolError):
    """One frame was rejected.

    ``code`` is the protocol's error code (``bad_frame``, ``frame_too_large``,
    ``integrity_mismatch``, ``unknown_op``, ``unauthorized``) and
    ``request_id`` the frame's ``id`` when one could be read, else ``None``.
    """

    def __init__(self, code: str, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        """The protocol's error code: ``bad_frame``, ``frame_too_large``..."""
        self.request_id = request_id
        """The frame's ``id`` when one could be read, else ``None``."""

    def __repr__(self) -> str:
        return f"FrameError(code={self.code!r}, message={self.message!r}, id={self.request_id!r})"


class IntegrityError(ProtocolError):
    """A body's SHA-256 did not match on arrival, again and again."""

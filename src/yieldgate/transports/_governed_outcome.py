"""What a governed server's reply means to a ``GovernedClient``'s Gate.

``classify_reply`` turns the terminal reply to a submit into an ``Outcome``:
``ok`` is a result, ``yield`` a backoff around the server's hint, and an
``error`` is retried or not by its code (``classify_error``). ``reply_error``
is the exception for a ``stats`` or ``ping`` that got something else than its
answer.
"""

from __future__ import annotations

from yieldgate._exceptions import IntegrityError, ProtocolError, RemoteError, YieldgateError
from yieldgate.gate import Outcome
from yieldgate.gate._outcome import sanitize_hint_s
from yieldgate.protocol import ErrorCode, ErrorReply, OkReply, Reply, YieldReply

__all__ = ["classify_error", "classify_reply", "reply_error"]

_FATAL_CODES = frozenset(
    {
        ErrorCode.BAD_FRAME,
        ErrorCode.FRAME_TOO_LARGE,
        ErrorCode.UNKNOWN_OP,
        ErrorCode.DUPLICATE_ID,
        ErrorCode.UNAUTHORIZED,
    }
)


def classify_reply(reply: Reply) -> Outcome:
    if isinstance(reply, OkReply):
        return Outcome.ok(reply.result)
    if isinstance(reply, YieldReply):
        # 10**400 ms is an integer JSON can carry: clamped, never an OverflowError.
        hint = sanitize_hint_s(reply.retry_hint_ms, unit_s=0.001)
        return Outcome.yielded(hint, reply.reason, value=reply)
    if isinstance(reply, ErrorReply):
        return classify_error(reply)
    return Outcome.fatal(ProtocolError(f"unexpected {type(reply).__name__} to a submit"))


def classify_error(reply: ErrorReply) -> Outcome:
    code = reply.code
    message = f"server error {code}: {reply.message}"
    if code == ErrorCode.INTEGRITY_MISMATCH:
        return Outcome.retryable(IntegrityError(message), value=reply)
    if code in _FATAL_CODES:
        return Outcome.fatal(RemoteError(message, code=code, retryable=False), value=reply)
    # The error keeps the server's own flag; whether to try again is the
    # client's call: a server shutting down will be replaced, and a deadline
    # that passed on the server was this attempt's, not necessarily the call's.
    error = RemoteError(message, code=code, retryable=reply.retryable)
    if reply.retryable or code in (ErrorCode.SHUTTING_DOWN, ErrorCode.DEADLINE_EXCEEDED):
        return Outcome.retryable(error, value=reply)
    return Outcome.fatal(error, value=reply)


def reply_error(reply: Reply, op: str) -> YieldgateError:
    if isinstance(reply, ErrorReply):
        return RemoteError(
            f"{op} failed: {reply.code}: {reply.message}",
            code=reply.code,
            retryable=reply.retryable,
        )
    return ProtocolError(f"unexpected {type(reply).__name__} to {op}")

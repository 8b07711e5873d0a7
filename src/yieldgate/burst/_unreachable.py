"""A target that cannot be reached, told apart from one that answers badly.

A request whose last attempt could not connect (connection refused, a host
name that does not resolve, a connect time-out) failed with the error kind
``unreachable``, whatever the client wrapped it in (a ``TransportError``, a
``RetriesExhaustedError`` or ``CircuitOpenError`` around one, httpx's or
openai's connection errors): the cause is what the report names, not the
breaker that opened after it. ``unreachable_reason`` reads that cause;
``unreachable_line`` says it with the address, ``unreached`` whether a whole
run never reached its target.
"""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from typing import Any

__all__ = ["NOT_REACHED", "UNREACHABLE", "unreachable_line", "unreachable_reason", "unreached"]

UNREACHABLE = "unreachable"
# Failures of requests that never reached a server: nothing was sent (an open breaker,
# the client's time-out while waiting) or nothing could be.
NOT_REACHED = frozenset({UNREACHABLE, "CircuitOpenError", "timeout"})

_ERRNOS = {
    errno.ECONNREFUSED: "connection refused",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "connect timed out",
}
_LINES = {
    "connection refused": "connection refused to {where}",
    "no route to host": "no route to {where}",
    "network unreachable": "network unreachable for {where}",
    "connect timed out": "connection to {where} timed out",
    "cannot resolve the host": "cannot resolve {host}",
    "cannot connect": "cannot connect to {where}",
}
# Connect errors of httpx / httpx2 / httpcore, by class name: the burst tool does not
# import them to ask. Not openai's APITimeoutError or APIConnectionError: openai raises
# them for any time-out or broken connection, a read as well as a connect; their cause,
# httpx's own error, is in the chain and says which.
_CONNECT_TIMEOUTS = frozenset({"ConnectTimeout"})
_CONNECT_ERRORS = frozenset({"ConnectError"})


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the errors of the outcomes the Gate kept."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        outcome_error = getattr(getattr(current, "last_outcome", None), "error", None)
        for nxt in (current.__cause__, current.__context__, outcome_error):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def unreachable_reason(exc: BaseException) -> str | None:
    """Why ``exc`` says its request could not reach the server (``"connection refused"``,
    ``"cannot resolve the host"``, ``"connect timed out"``), or ``None``."""
    general = None
    for error in _chain(exc):
        if isinstance(error, socket.gaierror):
            return "cannot resolve the host"
        if isinstance(error, OSError) and error.errno in _ERRNOS:
            return _ERRNOS[error.errno]
        name = type(error).__name__
        if name in _CONNECT_TIMEOUTS:
            return "connect timed out"
        message = str(error)
        if name == "TransportError" and message.startswith("cannot connect to"):
            # The governed client's: a time-out has no cause to read it from.
            if "no connection within" in message:
                return "connect timed out"
            general = general or "cannot connect"
        elif name in _CONNECT_ERRORS:
            general = general or "cannot connect"
    return general


def unreachable_line(exc: BaseException, host: str, port: int | None) -> str | None:
    """``unreachable_reason`` said with the address: ``connection refused to HOST:PORT``."""
    reason = unreachable_reason(exc)
    if reason is None:
        return None
    return _LINES[reason].format(where=f"{host}:{port}", host=host)


def _results(report: Any) -> Iterator[Any]:
    points = getattr(report, "points", None)
    if points is not None:  # a sweep: every point's results
        for _, point in points:
            yield from point.results
    else:
        yield from report.results


def unreached(report: Any) -> str | None:
    """The first ``unreachable`` reason of a run (a ``BurstReport`` or a sweep's) in which
    not one request reached its target, else ``None``."""
    reason = None
    for result in _results(report):
        kinds = set(result.errors_by_kind)
        if result.succeeded or not kinds <= NOT_REACHED:
            return None
        reason = reason or result.unreachable
    return reason

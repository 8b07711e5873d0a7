"""The HTTP front's connections: accepted like the TCP front's, and timed.

uvicorn times nothing on a connection before its first response (only then
does its keep-alive timer start) and never times a write, so a connection
that sends nothing, half a request line or part of its headers stayed open
for ever, and so did one whose reader stopped reading a stream. The front
therefore accepts connections itself and serves each with a guarded
protocol class:

- ``accept_connections`` closes connections past ``max_connections`` at
  once (counted), and when accepting fails (out of descriptors) pauses new
  connections for 100 ms while open ones are served, as the TCP front does.
  (uvicorn's own listener on uvloop would accept and drop every pending
  connection at EMFILE, and close the listener for good if that fails.)
- ``GuardedProtocol`` adds a head deadline: a request head must arrive whole
  within ``head_timeout_s`` of the connection's start, and of the end of each
  response, or the connection is closed (counted; uvicorn's 5 s keep-alive
  timer may close a silent one first). It must also fit in ``MAX_HEAD_BYTES``
  (h11's limit in uvicorn; httptools has none, and would keep growing a head
  sent fast): past it the connection is answered 431 (in the API shape of the
  request line's path) and closed (counted).
  Then a body deadline: a request's body must arrive whole within
  ``body_timeout_s`` of its head, or the request's scope is marked
  ``BODY_TIMED_OUT`` and the app, woken from its ``receive``, answers 408 in
  the route's dialect (``_http_inference``). Both deadlines share one timer
  per connection that is not set again for each request: a deadline is a
  number moved on as requests come, and the timer, when it fires early,
  waits again for the deadline that is due now (a busy connection costs a
  timer every ``head_timeout_s``, not two timer operations a request).
  And a write watch: while
  the transport's buffer is past its high-water mark, the peer must keep
  taking bytes (see ``_flow``); after ``write_timeout_s`` without progress
  the connection is aborted (counted), uvicorn tells the app the client left,
  and the app cancels the request's work, which frees its slot.

``GuardedProtocol`` is written against what uvicorn's h11 and httptools
protocols share: ``connection_made`` / ``connection_lost``,
``data_received``, ``on_response_complete``, ``pause_writing`` /
``resume_writing``, ``loop``, ``transport``, and ``cycle`` (with its
``more_body`` and ``response_complete``), a new object for each request
whose head was parsed (with httptools, the newest one: a
pipelined head is parsed while the previous request runs). So each parser's
guarded class is one line: ``protocol_class`` gives it. httptools (C, about
2.5x the replies of h11 on a bare app) is optional and imported only when
asked for; h11 always works.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import socket
import time
from collections.abc import Callable, Sized
from typing import TYPE_CHECKING, Any, Literal

import anyio
from uvicorn.protocols.http.h11_impl import H11Protocol

from yieldgate.protocol import ErrorCode
from yieldgate.server._flow import WriteProgress, check_interval_s
from yieldgate.server._http_responses import route_error

__all__ = [
    "BODY_TIMED_OUT",
    "ConnectionGuard",
    "GuardedH11Protocol",
    "GuardedProtocol",
    "Parser",
    "accept_connections",
    "protocol_class",
]

Parser = Literal["httptools", "h11"]

log = logging.getLogger("yieldgate.server")

_ACCEPT_BACKOFF_S = 0.1  # as the TCP front
MAX_HEAD_BYTES = 16 * 1024  # uvicorn's h11_max_incomplete_event_size default
# The scope key the guard sets on a request whose body did not arrive in time.
BODY_TIMED_OUT = "yieldgate.body_timed_out"
# What the connection's deadline is for.
_NOTHING, _HEAD, _BODY = 0, 1, 2
# How much of a head that arrives in pieces is kept, for its path in a 431's body.
_HEAD_START_BYTES = 1024


class ConnectionGuard:
    """What one front's connections share: their limits and their counters."""

    __slots__ = (
        "accepted",
        "body_timeout_s",
        "head_timeout_s",
        "head_timeouts",
        "heads_too_large",
        "max_connections",
        "refused",
        "write_timeout_s",
        "write_timeouts",
    )

    def __init__(
        self,
        *,
        head_timeout_s: float,
        body_timeout_s: float,
        write_timeout_s: float,
        max_connections: int,
    ) -> None:
        self.head_timeout_s = head_timeout_s
        self.body_timeout_s = body_timeout_s
        self.write_timeout_s = write_timeout_s
        self.max_connections = max_connections
        self.accepted = 0
        self.refused = 0  # closed at once: max_connections were open
        self.head_timeouts = 0  # closed: no whole request head in time
        self.heads_too_large = 0  # answered 431: a head past MAX_HEAD_BYTES
        self.write_timeouts = 0  # aborted: the peer took no bytes in time


if TYPE_CHECKING:
    # What the mixin is checked against; at run time it sits before the real class.
    _Base = H11Protocol
else:
    _Base = asyncio.Protocol


class GuardedProtocol(_Base):
    """Mixin for a uvicorn HTTP protocol class: put it first among the bases."""

    def __init__(self, *args: Any, guard: ConnectionGuard, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.guard = guard
        self._due_for = _NOTHING  # what the deadline is for
        self._due = 0.0  # the deadline, on the loop's clock
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._write_timer: asyncio.TimerHandle | None = None
        self._head_of: object = None  # the request whose head arrived last
        self._head_bytes = 0  # received since, once that request's body ended
        self._head_start = b""  # the first piece of those bytes
        self._progress: WriteProgress | None = None

    # -- uvicorn's hooks --------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._progress = WriteProgress(transport.get_extra_info("socket"))
        self._set_due(_HEAD, self.guard.head_timeout_s)  # uvicorn times nothing before a response

    def connection_lost(self, exc: Exception | None) -> None:
        for timer in (self._timer, self._write_timer):
            if timer is not None:
                timer.cancel()
        self._timer = self._write_timer = None
        self._due_for = _NOTHING
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # Judged before parsing: the bytes that end a body may begin the next head.
        next_head = self.cycle is None or not self.cycle.more_body
        super().data_received(data)
        cycle = self.cycle
        if cycle is not self._head_of:
            self._head_of = cycle  # a request head arrived whole
            self._head_bytes = 0
            self._time_body()
        elif next_head:
            if not self._head_bytes:
                self._head_start = data[:_HEAD_START_BYTES]
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
                self.guard.heads_too_large += 1
                self.transport.write(_head_too_large(self._head_start))
                self.transport.close()
        elif self._due_for == _BODY and not cycle.more_body:
            self._due_for = _NOTHING  # the body arrived whole

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not self._head_of:
            # h11 parses a pipelined request only now that the previous one is answered.
            self._head_of = self.cycle
            self._time_body()
        self._head_bytes = 0
        if self.transport.is_closing():
            if self.transport.get_write_buffer_size():
                # close() waits for these bytes: the peer must still take them.
                self._watch_write()
            return
        if not self.cycle.response_complete:
            return
        # The next head is due. uvicorn's keep-alive timer stops at its first
        # byte, and the rest of it (or of this request's body) might never come.
        self._set_due(_HEAD, self.guard.head_timeout_s)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_write()

    def resume_writing(self) -> None:
        super().resume_writing()
        if self._progress is not None:
            self._progress.finished()
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    # -- the deadlines ------------------------------------------------------------

    def _time_body(self) -> None:
        """A head arrived: its body, if some of it is still to come, is due."""
        if self.cycle.more_body:
            self._set_due(_BODY, self.guard.body_timeout_s)
        else:
            self._due_for = _NOTHING

    def _set_due(self, due_for: int, timeout_s: float) -> None:
        self._due_for = due_for
        self._due = self.loop.time() + timeout_s
        if self._timer is not None and self._timer_at <= self._due:
            return  # it fires first, and waits again for this deadline
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_at(self._due, self._check_due)
        self._timer_at = self._due

    def _check_due(self) -> None:
        self._timer = None
        if self._due_for == _NOTHING:
            return
        if self.loop.time() < self._due:
            self._timer = self.loop.call_at(self._due, self._check_due)
            self._timer_at = self._due
            return
        if self._due_for == _HEAD:
            self._due_for = _NOTHING
            self.guard.head_timeouts += 1
            # Not close(): it would wait for unsent bytes a silent peer may never take.
            self.transport.abort()
            return
        # The app answers (408, in its dialect) once woken from its receive().
        self._due_for = _NOTHING
        self.cycle.scope[BODY_TIMED_OUT] = True  # type: ignore[literal-required]
        self.cycle.message_event.set()

    def _watch_write(self) -> None:
        if self._progress is None or self._write_timer is not None:
            return
        self._progress.started(time.monotonic())
        self._write_timer = self.loop.call_later(self._check_every(), self._check_write)

    def _check_every(self) -> float:
        return check_interval_s(self.guard.write_timeout_s)

    def _check_write(self) -> None:
        self._write_timer = None
        assert self._progress is not None
        if self._progress.stalled(time.monotonic(), self.guard.write_timeout_s):
            self.guard.write_timeouts += 1
            self.transport.abort()
        else:
            self._write_timer = self.loop.call_later(self._check_every(), self._check_write)


class GuardedH11Protocol(GuardedProtocol, H11Protocol):
    """uvicorn's h11 protocol, guarded."""


@functools.cache
def protocol_class(parser: Parser) -> type[GuardedProtocol]:
    """The guarded uvicorn protocol class that parses with ``parser``."""
    if parser == "h11":
        return GuardedH11Protocol
    # Imported here: it imports httptools, which is optional.
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedHttpToolsProtocol(GuardedProtocol, HttpToolsProtocol):  # type: ignore[misc]
        """uvicorn's httptools protocol, guarded."""

    return GuardedHttpToolsProtocol


async def accept_connections(
    sock: socket.socket,
    protocol: Callable[[], asyncio.Protocol],
    guard: ConnectionGuard,
    connections: Sized,
) -> None:
    """Accept on the listening ``sock`` until cancelled, serving each connection with ``protocol``.

    ``connections`` are those open now (uvicorn's set): past
    ``guard.max_connections`` a new one is closed at once.
    """
    loop = asyncio.get_running_loop()
    while True:
        try:
            conn, _ = await loop.sock_accept(sock)
        except OSError as exc:
            # Out of descriptors (or memory): refuse for a moment, do not die.
            # Connections already open keep being served meanwhile.
            log.warning("HTTP accept failed (%s); pausing new connections for 100 ms", exc)
            await anyio.sleep(_ACCEPT_BACKOFF_S)
            continue
        if len(connections) >= guard.max_connections:
            guard.refused += 1
            conn.close()
            continue
        guard.accepted += 1
        try:
            await loop.connect_accepted_socket(protocol, conn)
        except OSError:
            conn.close()


def _head_too_large(head_start: bytes) -> bytes:
    """The 431 of a head past ``MAX_HEAD_BYTES``, its JSON body in the shape of the API
    family its path (read from the request line, where it arrived) is of."""
    target = head_start.partition(b" ")[2].partition(b" ")[0]
    path = target.partition(b"?")[0].decode("latin-1")
    message = f"request head larger than {MAX_HEAD_BYTES} bytes"
    error = route_error(path, ErrorCode.FRAME_TOO_LARGE, message, 431)
    body = json.dumps(error, separators=(",", ":")).encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
        b"content-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    ) + body

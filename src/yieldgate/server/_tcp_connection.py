"""One connection of the TCP front: its state, its writes and its idle clock.

A ``Connection`` is what ``TcpFront`` (``yieldgate.server.tcp``) keeps for
each peer: the submits in flight on it (by id, with the scope that cancels
each), the lock its writers share, the scopes that end its read loop (idle) or
everything it runs (write timeout), and the write progress the front's
watchdog checks.
"""

from __future__ import annotations

import math
import time

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from yieldgate._locks import acquire
from yieldgate.server._flow import WriteProgress

__all__ = ["BROKEN", "Connection"]

# What a read or write raises when the peer has gone (or the stream was closed).
BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)


class Connection:
    """One TCP connection's state and its writes, watched by the write watchdog."""

    __slots__ = (
        "closed",
        "idle",
        "idle_scope",
        "idle_timeout_s",
        "inflight",
        "last_words",
        "progress",
        "scope",
        "send_lock",
        "stream",
        "timed_out",
    )

    def __init__(self, stream: anyio.abc.SocketStream, idle_timeout_s: float) -> None:
        self.stream = stream
        self.send_lock = anyio.Lock()
        # The submits in flight, by id: the scope their execution runs in (cancel).
        self.inflight: dict[str, anyio.CancelScope] = {}
        self.closed = False
        self.idle: anyio.Event | None = None  # set when inflight empties, while draining
        self.idle_timeout_s = idle_timeout_s
        self.idle_scope: anyio.CancelScope | None = None  # ends the read loop when idle
        self.scope: anyio.CancelScope | None = None  # everything the connection runs
        self.progress = WriteProgress(stream.extra(SocketAttribute.raw_socket))
        self.timed_out = False  # the peer stopped taking replies: closing
        self.last_words: list[bytes] = []  # write_timeout replies, offered before closing

    def touch(self) -> None:
        """Restart the idle clock, or stop it while work is in flight.

        Called once per read that completed a frame: the deadline (a timer
        reset) only moves when it would move by more than a tenth of the
        timeout, so a busy connection costs a clock read, not a timer, per read.
        """
        scope = self.idle_scope
        if scope is None:
            return
        if self.inflight:
            if scope.deadline != math.inf:
                scope.deadline = math.inf
            return
        deadline = anyio.current_time() + self.idle_timeout_s
        if deadline - scope.deadline > 0.1 * self.idle_timeout_s or scope.deadline == math.inf:
            scope.deadline = deadline

    async def send(self, data: bytes) -> None:
        """Write ``data`` (one or more whole frames) after any write under way."""
        if self.closed:
            return
        await acquire(self.send_lock)  # usually nobody else is writing
        try:
            if not self.closed:
                await self.write(data)
        except BROKEN:
            self.closed = True
        finally:
            self.send_lock.release()

    async def write(self, data: bytes) -> None:
        """Write ``data``, watched by the write watchdog.

        The caller must be the only writer (hold ``send_lock``, or know that
        nobody else writes). A cancelled write never cuts a frame short: the
        transport takes all of ``data`` before the send waits for it to drain.
        """
        self.progress.started(time.monotonic())
        try:
            await self.stream.send(data)
        finally:
            self.progress.finished()

    def write_timed_out(self) -> None:
        """Called by the watchdog: stop everything this connection runs."""
        self.timed_out = self.closed = True
        if self.scope is not None:
            self.scope.cancel()

"""The governed protocol's TCP front: NDJSON over multiplexed connections.

One task reads each connection and answers everything it can at once inline
(yields, errors, ``stats``, ``ping``): replies produced from one read are
written back in one send. Only admitted submits get a task of their own, so a
burst that is mostly yielded costs no task per request; while a connection
has none, its reader is its only writer and sends without taking the lock.

A connection's end (EOF or reset) cancels every submit still executing for
it, and their slots return to the Governor at once. So does a ``cancel``
frame (protocol 1.1) for one submit: its execution stops, its slot is freed
and its terminal reply is ``cancelled``. A half-closed connection
counts as ended: a client must keep its write side open until its replies
have arrived. After a ``frame_too_large`` the server handles no more frames
from that connection (it reads and discards, only to notice the peer leave),
and submits it already admitted run to their terminal reply before the
connection is closed: every admitted submit is answered once.

Flow control. A watchdog closes a connection whose pending write has made
no progress for ``write_timeout_s`` (progress: the peer acknowledged bytes,
where the kernel tells, else the write completed), after cancelling its work
(slots freed, counted cancelled) and offering each cancelled submit a
``write_timeout`` reply, which only a reader that came back in time still
gets. A slow reader that keeps taking bytes is never cut off; one that
stopped can hold a slot for at most about the write timeout.

No single line can take the server down: whatever handling a line raises is
logged and answered ``bad_frame``.

Here: ``TcpFront`` listening, accepting (the connection cap, the pause when
descriptors run out), the write watchdog, shutdown and the counters. What it
does on each connection is ``_tcp_serving``; a connection's state and writes
are ``_tcp_connection``; ``TcpConfig`` (re-exported here) is ``_tcp_config``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from yieldgate.server._fastframe import fast_submit_decoder
from yieldgate.server._flow import check_interval_s
from yieldgate.server._tcp_config import TcpConfig
from yieldgate.server._tcp_connection import Connection
from yieldgate.server._tcp_serving import ServesConnections, YieldReplies
from yieldgate.server.admission import Admission, Outstanding
from yieldgate.server.backends import Backend
from yieldgate.server.governor import Governor

__all__ = ["TcpConfig", "TcpFront"]

log = logging.getLogger("yieldgate.server")

_ACCEPT_BACKOFF_S = 0.1


class TcpFront(ServesConnections):
    """Serves the governed protocol over TCP for one Governor and backend."""

    def __init__(
        self,
        governor: Governor,
        backend: Backend,
        config: TcpConfig | None = None,
        *,
        admission: Admission | None = None,
        stats: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.governor = governor
        """The Governor that admits or yields each submit."""
        self.backend = backend
        """The backend that executes what is admitted."""
        self.admission = admission or Admission(governor, backend)
        """The admission it shares with the other fronts of its server."""
        self.config = config or TcpConfig()
        """Where and how it listens."""
        self.address: tuple[str, int] | None = None
        """The ``(host, port)`` it listens on, once serving; ``None`` before."""
        self._accept_scope: anyio.CancelScope | None = None
        self._accepting = True
        self._conns_scope: anyio.CancelScope | None = None
        self._connections_refused = 0
        self._open = 0
        self._connections_idle_closed = 0
        self._connections_write_timeout = 0
        self._connections: set[Connection] = set()  # open ones, for the write watchdog
        self._connections_total = 0
        self._outstanding = Outstanding()
        # Well-formed submits skip the reference decoder when msgspec is installed.
        self._fast_submit = fast_submit_decoder(self.config.secret)
        self._hard_stop = False
        self._stats_source = stats
        self._yields = YieldReplies()

    # -- lifecycle ----------------------------------------------------------

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[tuple[str, int]] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen, report ``(host, port)`` through ``task_status``, serve until ``close``."""
        listener = await anyio.create_tcp_listener(
            local_host=self.config.host, local_port=self.config.port
        )
        async with listener, anyio.create_task_group() as conns:
            self._conns_scope = conns.cancel_scope
            port = listener.extra(SocketAttribute.local_port)
            self.address = (self.config.host, port)
            conns.start_soon(self._watch_writes)
            task_status.started(self.address)
            with anyio.CancelScope() as self._accept_scope:
                if self._accepting:
                    # One socket per address the host resolved to (e.g. v4 and v6).
                    async with anyio.create_task_group() as accepting:
                        for one in listener.listeners:
                            accepting.start_soon(self._accept_loop, one, conns)
            await listener.aclose()
            # No longer accepting; open connections are served until close().
            await anyio.sleep_forever()

    async def _accept_loop(
        self, listener: anyio.abc.Listener[anyio.abc.SocketStream], conns: anyio.abc.TaskGroup
    ) -> None:
        assert isinstance(listener, anyio.abc.SocketListener)
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                # Out of descriptors (or memory): refuse for a moment, do not die.
                # Connections already open keep being served meanwhile.
                log.warning("accept failed (%s); pausing new connections for 100 ms", exc)
                await anyio.sleep(_ACCEPT_BACKOFF_S)
                continue
            if self._open >= self.config.max_connections:
                self._connections_refused += 1
                await stream.aclose()
                continue
            self._open += 1  # counted now, not when its task starts: bursts see the limit
            conns.start_soon(self._handle, stream)

    def stop_accepting(self) -> None:
        """Close the listening socket; open connections are still served."""
        self._accepting = False
        if self._accept_scope is not None:
            self._accept_scope.cancel()

    async def wait_drained(self) -> None:
        """Return once no admitted submit of this front is executing or unanswered."""
        await self._outstanding.wait_idle()

    def close(self) -> None:
        """Close every connection; submits still executing get ``shutting_down``."""
        self._hard_stop = True
        self.stop_accepting()
        if self._conns_scope is not None:
            self._conns_scope.cancel()

    def connection_stats(self) -> dict[str, int]:
        """The TCP connection counters (``connections_open``...), part of the server's stats."""
        return {
            "connections_open": self._open,
            "connections_total": self._connections_total,
            "connections_refused_total": self._connections_refused,
            "connections_idle_closed_total": self._connections_idle_closed,
            "connections_write_timeout_total": self._connections_write_timeout,
        }

    async def _watch_writes(self) -> None:
        """Time out writes that made no progress for ``write_timeout_s``.

        One watchdog for every connection costs a clock read per write instead
        of a timer per write. It looks every quarter of the timeout (at most a
        second), so a stuck write is noticed between 1 and about 1.5 timeouts
        after its peer stopped taking bytes.
        """
        timeout = self.config.write_timeout_s
        while True:
            await anyio.sleep(check_interval_s(timeout))
            now = time.monotonic()
            for conn in self._connections:
                if not conn.timed_out and conn.progress.stalled(now, timeout):
                    conn.write_timed_out()

    # -- one connection -----------------------------------------------------

    async def _handle(self, stream: anyio.abc.SocketStream) -> None:
        conn = Connection(stream, self.config.idle_timeout_s)
        self._connections_total += 1
        self._connections.add(conn)
        try:
            async with stream:
                with anyio.CancelScope() as conn.scope:
                    await self._serve_connection(conn)
                if conn.timed_out:
                    self._connections_write_timeout += 1
                    await self._say_last_words(conn)
        finally:
            self._connections.discard(conn)
            self._open -= 1

    def stats(self) -> dict[str, Any]:
        """What the ``stats`` op reports: the ``stats`` callable given, else the
        Governor's counters and this front's connections."""
        if self._stats_source is not None:
            return self._stats_source()
        counters = self.governor.stats().as_dict()
        counters.update(self.connection_stats())
        return counters

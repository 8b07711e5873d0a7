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
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

from yieldgate._exceptions import FrameError
from yieldgate._locks import acquire
from yieldgate.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    CancelRequest,
    ErrorCode,
    PingRequest,
    Priority,
    StatsRequest,
    SubmitRequest,
    chunk_frame,
    decode_request,
    encode_frame,
    encode_yield,
    error_frame,
    ok_frame,
    pong_frame,
    stats_reply_frame,
)
from yieldgate.server._fastframe import FastSubmit, fast_submit_decoder
from yieldgate.server._flow import WriteProgress, check_interval_s
from yieldgate.server.admission import Admission, Admitted, Failure, Outstanding
from yieldgate.server.backends import Backend, Emit
from yieldgate.server.governor import Governor, Slot, Yield

__all__ = ["TcpConfig", "TcpFront"]

log = logging.getLogger("yieldgate.server")

_READ_SIZE = 65536
_ACCEPT_BACKOFF_S = 0.1
# After a write timeout, how long the cancelled submits' replies may wait for
# a reader that came back before the connection is closed.
_LAST_WORDS_S = 0.5
_BROKEN = (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError)
_NORMAL = Priority.NORMAL


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpConfig:
    """Where and how the TCP front listens."""

    host: str = "127.0.0.1"
    port: int = 7070
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    secret: str | None = None
    # A connection with nothing in flight that completes no frame for this long
    # is closed (idle clients, and slowloris lines that never end).
    idle_timeout_s: float = 300.0
    # Connections beyond this many are closed as soon as they are accepted.
    max_connections: int = 10_000
    # A connection whose peer takes no bytes of a pending reply for this long is
    # closed and its work cancelled: a reader that stopped cannot hold a slot.
    write_timeout_s: float = 30.0

    def __post_init__(self) -> None:
        if not (self.idle_timeout_s > 0 and math.isfinite(self.idle_timeout_s)):
            raise ValueError("idle_timeout_s must be a positive number")
        if not (self.write_timeout_s > 0 and math.isfinite(self.write_timeout_s)):
            raise ValueError("write_timeout_s must be a positive number")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_frame_bytes < 64:
            raise ValueError("max_frame_bytes must be at least 64")
        if self.secret is not None and not self.secret:
            raise ValueError("secret must not be empty (leave it unset for no auth)")


class _Connection:
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
        except _BROKEN:
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


class _YieldReplies:
    """``encode_yield``, remembering the bytes after the id of the last reply.

    A saturated server answers nearly every submit with the same ``Yield``
    (the Governor reuses it until the hint moves, by the millisecond): only
    the ``id`` differs, and only a new ``Yield`` is encoded in full.
    """

    __slots__ = ("_last", "_tail")

    def __init__(self) -> None:
        self._last: Yield | None = None
        self._tail = b""

    def encode(self, rid: str, refusal: Yield) -> bytes:
        quoted = encode_basestring(rid).encode("utf-8")
        if refusal is self._last:
            return b'{"id":' + quoted + self._tail
        reply = encode_yield(
            rid,
            retry_hint_ms=refusal.retry_hint_ms,
            inflight=refusal.inflight,
            max_inflight=refusal.max_inflight,
            reason=refusal.reason,
        )
        head = b'{"id":' + quoted
        if reply.startswith(head):
            self._last = refusal
            self._tail = reply[len(head) :]
        return reply


class TcpFront:
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
        self.backend = backend
        self.admission = admission or Admission(governor, backend)
        self.config = config or TcpConfig()
        self.address: tuple[str, int] | None = None
        self._accept_scope: anyio.CancelScope | None = None
        self._accepting = True
        self._conns_scope: anyio.CancelScope | None = None
        self._connections_refused = 0
        self._open = 0
        self._connections_idle_closed = 0
        self._connections_write_timeout = 0
        self._connections: set[_Connection] = set()  # open ones, for the write watchdog
        self._connections_total = 0
        self._outstanding = Outstanding()
        # Well-formed submits skip the reference decoder when msgspec is installed.
        self._fast_submit = fast_submit_decoder(self.config.secret)
        self._hard_stop = False
        self._stats_source = stats
        self._yields = _YieldReplies()

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
        conn = _Connection(stream, self.config.idle_timeout_s)
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

    async def _serve_connection(self, conn: _Connection) -> None:
        async with anyio.create_task_group() as work:
            with anyio.CancelScope() as conn.idle_scope:
                conn.touch()
                peer_gone = await self._read_loop(conn, work)
            if conn.idle_scope.cancelled_caught:
                self._connections_idle_closed += 1
                peer_gone = True  # idle: close it like a peer that left
            conn.idle_scope = None
            if not peer_gone:
                # frame_too_large: answer the admitted work, but still notice
                # (by reading and discarding) a peer that leaves meanwhile.
                peer_gone = await self._drain(conn)
            if peer_gone:
                # Nobody is left to answer: cancel the connection's work now.
                conn.closed = True
                work.cancel_scope.cancel()

    async def _say_last_words(self, conn: _Connection) -> None:
        """Offer the ``write_timeout`` replies to a reader that may have come back."""
        if not conn.last_words:
            return
        with anyio.move_on_after(_LAST_WORDS_S, shield=True), contextlib.suppress(*_BROKEN):
            await conn.stream.send(b"".join(conn.last_words))

    async def _drain(self, conn: _Connection) -> bool:
        """Discard input until the connection's work is answered (False) or the peer leaves."""
        if not conn.inflight:
            return False
        conn.idle = idle = anyio.Event()
        gone = False
        async with anyio.create_task_group() as tg:

            async def discard() -> None:
                nonlocal gone
                try:
                    while True:
                        await conn.stream.receive(_READ_SIZE)
                except _BROKEN:
                    gone = True
                tg.cancel_scope.cancel()

            async def answered() -> None:
                await idle.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(discard)
            tg.start_soon(answered)
        return gone

    async def _read_loop(self, conn: _Connection, work: anyio.abc.TaskGroup) -> bool:
        """Read and answer frames; True when the peer went away, False after frame_too_large."""
        limit = self.config.max_frame_bytes
        stream = conn.stream
        inflight = conn.inflight
        fast_submit = self._fast_submit
        on_submit = self._on_submit
        buf = bytearray()
        scanned = 0
        while True:
            try:
                data = await stream.receive(_READ_SIZE)
            except _BROKEN:
                return True
            buf += data
            out: list[bytes] = []
            start = 0
            while (nl := buf.find(b"\n", scanned)) >= 0:
                if nl - start > limit:
                    await self._too_large(conn, out)
                    return False
                line = bytes(buf[start:nl])
                start = scanned = nl + 1
                try:
                    # fast path: a well-formed submit, decoded and checked in one go
                    fast = None if fast_submit is None else fast_submit(line)
                    if fast is None:
                        self._on_line(conn, line, work, out)
                    else:
                        on_submit(conn, fast, work, out)
                except Exception:
                    log.exception("could not handle a %d-byte line; answered bad_frame", len(line))
                    out.append(self._error(None, ErrorCode.BAD_FRAME, "frame could not be handled"))
            if start:
                del buf[:start]
                conn.touch()  # a complete frame: the connection is not idle
            scanned = len(buf)
            if len(buf) > limit:
                await self._too_large(conn, out)
                return False
            if not out:
                continue
            if inflight:
                await conn.send(b"".join(out))
            elif not conn.closed:
                # Nothing admitted on this connection, so no other task writes to
                # it, and none can start before this write returns: no lock needed.
                try:
                    await conn.write(b"".join(out))
                except _BROKEN:
                    conn.closed = True

    async def _too_large(self, conn: _Connection, out: list[bytes]) -> None:
        message = f"frame exceeds max_frame_bytes={self.config.max_frame_bytes}; closing"
        out.append(self._error(None, ErrorCode.FRAME_TOO_LARGE, message))
        await conn.send(b"".join(out))

    def _error(
        self, rid: str | None, code: ErrorCode, message: str, *, retryable: bool | None = None
    ) -> bytes:
        self.governor.record_error(code)
        # A message quoting client or backend text may hold lone surrogates.
        message = message.encode("utf-8", "backslashreplace").decode("utf-8")
        return encode_frame(error_frame(rid, code, message, retryable=retryable))

    def _on_line(
        self, conn: _Connection, line: bytes, work: anyio.abc.TaskGroup, out: list[bytes]
    ) -> None:
        """Any line the fast path did not take, through the reference decoder."""
        try:
            req = decode_request(line, secret=self.config.secret)
        except FrameError as exc:
            out.append(self._error(exc.request_id, ErrorCode(exc.code), exc.message))
            return
        if isinstance(req, PingRequest):
            out.append(encode_frame(pong_frame(req.id)))
            return
        if isinstance(req, StatsRequest):
            out.append(encode_frame(stats_reply_frame(req.id, self.stats())))
            return
        if isinstance(req, CancelRequest):
            # No reply of its own: the submit's terminal reply says what happened.
            # A cancel for an id not in flight (unknown, or answered) is ignored:
            # it raced with the reply, and either order is fine.
            scope = conn.inflight.get(req.id)
            if scope is not None:
                scope.cancel()
            return
        self._on_submit(conn, req, work, out)

    def _on_submit(
        self,
        conn: _Connection,
        req: SubmitRequest | FastSubmit,
        work: anyio.abc.TaskGroup,
        out: list[bytes],
    ) -> None:
        rid = req.id
        if rid in conn.inflight:
            message = f"id {rid[:64]!r} is still in flight on this connection"
            out.append(self._error(rid, ErrorCode.DUPLICATE_ID, message))
            return
        # A FastSubmit leaves out what the frame left out: the defaults apply.
        decision = self.admission.admit(
            rid,
            req.body,
            params=req.params or {},
            priority=req.priority or _NORMAL,
            stream=req.stream is True,
            deadline_ms=req.deadline_ms,
        )
        if isinstance(decision, Yield):
            out.append(self._yields.encode(rid, decision))
        elif isinstance(decision, Failure):
            out.append(
                self._error(rid, decision.code, decision.message, retryable=decision.retryable)
            )
        else:
            # Made here, not in the task: a cancel may come before the task starts.
            scope = conn.inflight[rid] = anyio.CancelScope()
            self._outstanding.add()
            request = req if isinstance(req, SubmitRequest) else req.request()
            work.start_soon(self._run, conn, request, decision, scope)

    # -- one admitted submit ------------------------------------------------

    async def _run(
        self, conn: _Connection, req: SubmitRequest, admitted: Admitted, scope: anyio.CancelScope
    ) -> None:
        finished = False
        try:
            reply = b""
            with scope:  # what the client's cancel op cancels
                try:
                    reply = await self._execute(conn, req, admitted)
                except Exception:
                    # _execute answers everything it expects; this is a bug, not a crash.
                    log.exception("handling %r failed", req.id)
                    admitted.slot.release("failed")
                    reply = self._error(
                        req.id, ErrorCode.BACKEND_ERROR, "internal error", retryable=False
                    )
                finally:
                    admitted.slot.release("cancelled")  # a no-op unless execution was cancelled
            if scope.cancelled_caught:
                message = "cancelled by the client"
                reply = self._error(req.id, ErrorCode.CANCELLED, message, retryable=False)
            # From here the terminal reply exists: a shutdown must not send another.
            finished = True
            await conn.send(reply)
        except anyio.get_cancelled_exc_class():
            if not finished and conn.timed_out:
                message = f"the client took no reply for {self.config.write_timeout_s:g} s"
                conn.last_words.append(self._error(req.id, ErrorCode.WRITE_TIMEOUT, message))
            elif not finished and self._hard_stop and not conn.closed:
                message = "server shut down before this submit finished"
                data = self._error(req.id, ErrorCode.SHUTTING_DOWN, message, retryable=True)
                with anyio.move_on_after(1.0, shield=True):
                    await conn.send(data)
            raise
        finally:
            # The id stays in flight until its terminal reply is out (duplicate_id).
            del conn.inflight[req.id]
            if not conn.inflight:
                conn.touch()
                if conn.idle is not None:
                    conn.idle.set()
            self._outstanding.done()

    async def _execute(self, conn: _Connection, req: SubmitRequest, admitted: Admitted) -> bytes:
        emit = self._emitter(conn, req.id) if req.stream else None

        async def finish(result: Any, slot: Slot) -> bytes:
            return encode_frame(ok_frame(req.id, result, slot.elapsed_ms()))

        outcome = await self.admission.execute(admitted, emit, finish)
        if isinstance(outcome, Failure):
            return self._error(req.id, outcome.code, outcome.message, retryable=outcome.retryable)
        return outcome

    def _emitter(self, conn: _Connection, rid: str) -> Emit:
        seq = 0

        async def emit(data: Any) -> None:
            nonlocal seq
            frame = encode_frame(chunk_frame(rid, seq, data))
            seq += 1
            await conn.send(frame)

        return emit

    def stats(self) -> dict[str, Any]:
        """What the ``stats`` op reports: the ``stats`` callable given, else the
        Governor's counters and this front's connections."""
        if self._stats_source is not None:
            return self._stats_source()
        counters = self.governor.stats().as_dict()
        counters.update(self.connection_stats())
        return counters

"""What the TCP front does on each connection: read frames, answer them, run admitted submits.

``TcpFront`` (``yieldgate.server.tcp``) listens, accepts and keeps the books;
it inherits the serving of each connection it accepted from
``ServesConnections``: the read loop (replies produced from one read go out
in one send), the ops it answers inline (``ping``, ``stats``, ``cancel``,
yields and errors), the task of each admitted submit and its one terminal
reply, the ``frame_too_large`` drain, and the ``write_timeout`` replies
offered after a write timeout. ``YieldReplies`` encodes the yields.
"""

from __future__ import annotations

import contextlib
import logging
from json.encoder import encode_basestring
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc

from yieldgate._exceptions import FrameError
from yieldgate.protocol import (
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
from yieldgate.server._fastframe import FastDecode, FastSubmit
from yieldgate.server._tcp_config import TcpConfig
from yieldgate.server._tcp_connection import BROKEN, Connection
from yieldgate.server.admission import Admission, Admitted, Failure, Outstanding
from yieldgate.server.backends import Emit
from yieldgate.server.governor import Governor, Slot, Yield

__all__ = ["ServesConnections", "YieldReplies"]

log = logging.getLogger("yieldgate.server")

_READ_SIZE = 65536
# After a write timeout, how long the cancelled submits' replies may wait for
# a reader that came back before the connection is closed.
_LAST_WORDS_S = 0.5
_NORMAL = Priority.NORMAL


class YieldReplies:
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


class ServesConnections:
    """Serving one accepted connection, for ``TcpFront``, which sets what is declared here."""

    config: TcpConfig
    governor: Governor
    admission: Admission
    _connections_idle_closed: int
    _fast_submit: FastDecode | None
    _hard_stop: bool
    _outstanding: Outstanding
    _yields: YieldReplies

    if TYPE_CHECKING:

        def stats(self) -> dict[str, Any]: ...

    # -- one connection -----------------------------------------------------

    async def _serve_connection(self, conn: Connection) -> None:
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

    async def _say_last_words(self, conn: Connection) -> None:
        """Offer the ``write_timeout`` replies to a reader that may have come back."""
        if not conn.last_words:
            return
        with anyio.move_on_after(_LAST_WORDS_S, shield=True), contextlib.suppress(*BROKEN):
            await conn.stream.send(b"".join(conn.last_words))

    async def _drain(self, conn: Connection) -> bool:
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
                except BROKEN:
                    gone = True
                tg.cancel_scope.cancel()

            async def answered() -> None:
                await idle.wait()
                tg.cancel_scope.cancel()

            tg.start_soon(discard)
            tg.start_soon(answered)
        return gone

    async def _read_loop(self, conn: Connection, work: anyio.abc.TaskGroup) -> bool:
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
            except BROKEN:
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
                except BROKEN:
                    conn.closed = True

    async def _too_large(self, conn: Connection, out: list[bytes]) -> None:
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
        self, conn: Connection, line: bytes, work: anyio.abc.TaskGroup, out: list[bytes]
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
        conn: Connection,
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
        self, conn: Connection, req: SubmitRequest, admitted: Admitted, scope: anyio.CancelScope
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

    async def _execute(self, conn: Connection, req: SubmitRequest, admitted: Admitted) -> bytes:
        emit = self._emitter(conn, req.id) if req.stream else None

        async def finish(result: Any, slot: Slot) -> bytes:
            return encode_frame(ok_frame(req.id, result, slot.elapsed_ms()))

        outcome = await self.admission.execute(admitted, emit, finish)
        if isinstance(outcome, Failure):
            return self._error(req.id, outcome.code, outcome.message, retryable=outcome.retryable)
        return outcome

    def _emitter(self, conn: Connection, rid: str) -> Emit:
        seq = 0

        async def emit(data: Any) -> None:
            nonlocal seq
            frame = encode_frame(chunk_frame(rid, seq, data))
            seq += 1
            await conn.send(frame)

        return emit

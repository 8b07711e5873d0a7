"""The connections of one ``GovernedClient``, and one request's trip over them.

Per server (an ``Endpoint``), the pool keeps one shared connection that
carries all plain submits at once, and a few idle exclusive connections for
the requests that need one to themselves: streams, and every attempt under a
hedge policy. It opens connections (within the connect timeout), runs their
readers in the client's task group, and sends each attempt to the server the
Gate chose for it. It also holds the client's lifecycle state, which decides
whether a connection may still be opened or pooled.

``open_request`` sends a frame and returns the stream its replies arrive on;
``finish_request`` stops waiting: an exclusive connection whose reply was
complete goes back to the pool, one that was not is closed (which cancels the
work on any server), and an incomplete request on the shared connection is
cancelled with protocol 1.1's ``cancel`` op. ``ask`` is both, for a request
with one reply.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from yieldgate._exceptions import GateClosedError, ProtocolError, TransportError, YieldgateError
from yieldgate.gate import AttemptInfo, current_attempt
from yieldgate.protocol import ChunkReply, Reply, cancel_frame, encode_frame
from yieldgate.transports._governed_connection import (
    Connection,
    Endpoint,
    address,
    next_reply,
    parse_url,
)

__all__ = ["STREAM_BUFFER", "FrameTooLargeError", "Pool"]


class FrameTooLargeError(ProtocolError):
    """A request that the server's frame limit would refuse: not worth retrying."""


# Idle connections kept per server for attempts that need one to themselves.
_MAX_IDLE_EXCLUSIVE = 32
# Replies a stream's consumer may leave unread before its connection's reader waits.
STREAM_BUFFER = 64


class Pool:
    """The connections of one client, and its lifecycle: ``new``, then ``open``
    once its ``async with`` block runs the readers' task group, then ``closed``."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        auth: str | None,
        connect_timeout: float,
        max_frame_bytes: int,
    ) -> None:
        self.endpoints: dict[str, Endpoint] = {}
        for one in urls:
            endpoint = Endpoint(one)
            self.endpoints.setdefault(endpoint.url, endpoint)
        self.default = next(iter(self.endpoints.values()))
        self.auth = auth
        self.connect_timeout = connect_timeout
        self.max_frame_bytes = max_frame_bytes
        self.connections: set[Connection] = set()
        self.tasks: anyio.abc.TaskGroup | None = None
        self.state = "new"

    def start(self) -> None:
        """Open the pool, once; its task group is set next."""
        if self.state != "new":
            raise GateClosedError("a GovernedClient can be entered only once")
        self.state = "open"

    async def aclose(self) -> None:
        """Close every connection; the requests on them fail with ``TransportError``."""
        if self.state == "closed":
            return
        self.state = "closed"
        for conn in list(self.connections):
            # Closing the stream ends the reader task. (The task group's scope
            # wraps the user's own block: cancelling it would cancel them too.)
            await conn.close(TransportError("client closed"))

    def check_open(self) -> None:
        if self.state != "open":
            message = (
                "use the client as `async with GovernedClient(...) as client:`"
                if self.state == "new"
                else "client is closed"
            )
            raise GateClosedError(message)

    def _endpoint(self, attempt: AttemptInfo | None) -> Endpoint:
        if attempt is None or attempt.upstream is None:
            return self.default
        where = attempt.target if attempt.target is not None else attempt.upstream
        endpoint = self.endpoints.get(where) if isinstance(where, str) else None
        if endpoint is None and isinstance(where, str):
            # Named without the scheme, say: compare the normalised address.
            with contextlib.suppress(ValueError):
                endpoint = self.endpoints.get(address(*parse_url(where)))
        if endpoint is None:
            raise ValueError(
                f"the Gate chose upstream {attempt.upstream!r} ({where!r}), "
                f"which is not one of this client's URLs {list(self.endpoints)}"
            )
        return endpoint

    async def _connect(self, endpoint: Endpoint, *, exclusive: bool) -> Connection:
        self.check_open()
        stream: anyio.abc.SocketStream | None = None
        try:
            with anyio.move_on_after(self.connect_timeout):
                stream = await anyio.connect_tcp(endpoint.host, endpoint.port)
        except OSError as exc:  # refused, unreachable, or the kernel's own timeout
            raise TransportError(f"cannot connect to {endpoint.url}: {exc}") from exc
        if stream is None:
            raise TransportError(
                f"cannot connect to {endpoint.url}: no connection within "
                f"connect_timeout={self.connect_timeout:g} s"
            )
        conn = Connection(stream, self.max_frame_bytes, endpoint=endpoint, exclusive=exclusive)
        self.connections.add(conn)
        assert self.tasks is not None
        self.tasks.start_soon(self._read, conn)
        return conn

    async def _read(self, conn: Connection) -> None:
        try:
            await conn.read_loop()
        finally:
            self.connections.discard(conn)

    async def _connection(self, endpoint: Endpoint) -> Connection:
        conn = endpoint.conn
        if conn is not None and not conn.broken:
            return conn
        async with endpoint.connect_lock:
            if endpoint.conn is not None and not endpoint.conn.broken:
                return endpoint.conn
            endpoint.conn = await self._connect(endpoint, exclusive=False)
            return endpoint.conn

    async def _exclusive(self, endpoint: Endpoint) -> Connection:
        while endpoint.idle:
            conn = endpoint.idle.pop()
            if not conn.broken:
                return conn
        return await self._connect(endpoint, exclusive=True)

    async def open_request(
        self, frame: dict[str, Any], *, stream: bool = False
    ) -> tuple[Connection, str, MemoryObjectReceiveStream[Reply]]:
        data = encode_frame(frame)
        if len(data) - 1 > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"a {len(data) - 1}-byte frame exceeds max_frame_bytes={self.max_frame_bytes} "
                "(the server's limit, 1 MiB unless configured otherwise)"
            )
        attempt = current_attempt()
        endpoint = self._endpoint(attempt)
        if stream or (attempt is not None and attempt.hedging):
            conn = await self._exclusive(endpoint)
        else:
            conn = await self._connection(endpoint)
        rid = frame["id"]
        send, receive = anyio.create_memory_object_stream[Reply](
            STREAM_BUFFER if conn.exclusive else 1
        )
        conn.waiters[rid] = send
        try:
            await conn.send(data)
        except BaseException:
            await self.finish_request(conn, rid, receive, complete=False)
            raise
        return conn, rid, receive

    async def finish_request(
        self,
        conn: Connection,
        rid: str,
        receive: MemoryObjectReceiveStream[Reply],
        *,
        complete: bool,
    ) -> None:
        """Stop waiting for ``rid``. An exclusive connection goes back to its pool
        if the reply was ``complete``; if not, it is closed, which cancels the
        request on the server. On the shared connection an incomplete request is
        cancelled with the ``cancel`` op, and a draining connection is closed
        once nothing waits on it."""
        waiter = conn.waiters.pop(rid, None)
        if waiter is not None:
            waiter.close()
        receive.close()
        if not conn.exclusive:
            if conn.draining and not conn.waiters:
                await conn.close(TransportError("connection drained"))
            elif not complete and not conn.broken and self.state == "open":
                self._send_cancel(conn, rid)
            return
        if complete and not conn.broken and self.state == "open":
            endpoint = conn.endpoint
            if endpoint is not None and len(endpoint.idle) < _MAX_IDLE_EXCLUSIVE:
                endpoint.idle.append(conn)
                return
        await conn.close(TransportError("request abandoned"))

    def _send_cancel(self, conn: Connection, rid: str) -> None:
        """Ask the server to stop ``rid`` (protocol 1.1), from the client's own task
        group: the caller leaving (often cancelled itself) never waits on the send."""
        assert self.tasks is not None
        data = encode_frame(cancel_frame(rid, auth=self.auth))

        async def send() -> None:
            # A connection that broke meanwhile cancelled everything on it anyway.
            with contextlib.suppress(YieldgateError):
                await conn.send(data)

        self.tasks.start_soon(send)

    async def ask(self, frame: dict[str, Any]) -> Reply:
        conn, rid, receive = await self.open_request(frame)
        complete = False
        try:
            reply = await next_reply(conn, receive)
            complete = not isinstance(reply, ChunkReply)
            return reply
        finally:
            await self.finish_request(conn, rid, receive, complete=complete)

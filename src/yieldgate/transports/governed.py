"""``GovernedClient``: the governed protocol over one multiplexed TCP connection.

Every request goes through a Gate: a ``yield`` narrows the window and is
waited out around its hint, failures are retried within the budget, and the
remaining time budget travels to the server as ``deadline_ms`` (so work the
client has given up on is cancelled there too). Bodies carry their SHA-256.

One connection carries all plain submits at once; a reader task routes
replies to their requests by ``id``. A broken connection fails its pending
requests with ``TransportError`` (retryable) and the next attempt reconnects.
A submit its caller abandons (cancelled, or past its attempt's timeout) is
cancelled on the server with protocol 1.1's ``cancel`` op, so its slot frees
at once there too; a version-1 server ignores the op and runs it to its end.

A stream, and under a hedge policy every attempt, has a connection to itself
(reused from a small pool once its reply is complete). A stream's chunks wait
in a small buffer; when the consumer stops reading, the reader stops too, and
TCP's flow control reaches the server (which, past its write timeout, cancels
the work). Leaving a stream before its end, or a hedge losing the race, closes
its connection, which cancels its work on any version of the server. Given
several URLs, the client is a set of upstreams for its Gate, which picks one
per attempt.

A connection whose server answered ``frame_too_large`` takes no new requests
and is closed once the requests it carries are answered or abandoned.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from yieldgate._exceptions import (
    GateClosedError,
    IntegrityError,
    ProtocolError,
    RemoteError,
    StreamInterruptedError,
    TransportError,
    YieldgateError,
)
from yieldgate.gate import USE_POLICY, AttemptInfo, Gate, Outcome, UsePolicy, current_attempt
from yieldgate.gate._outcome import sanitize_hint_s
from yieldgate.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    ChunkReply,
    ErrorCode,
    ErrorReply,
    OkReply,
    PongReply,
    Priority,
    Reply,
    StatsReply,
    YieldReply,
    cancel_frame,
    decode_reply,
    encode_frame,
    ping_frame,
    stats_frame,
    submit_frame,
)

__all__ = ["GovernedClient", "GovernedStream"]

_FATAL_CODES = frozenset(
    {
        ErrorCode.BAD_FRAME,
        ErrorCode.FRAME_TOO_LARGE,
        ErrorCode.UNKNOWN_OP,
        ErrorCode.DUPLICATE_ID,
        ErrorCode.UNAUTHORIZED,
    }
)


def _address(host: str, port: int) -> str:
    """The one spelling of a server's URL: an endpoint's name and key."""
    return f"tcp://{host}:{port}"


class _FrameTooLargeError(ProtocolError):
    """A request that the server's frame limit would refuse: not worth retrying."""


def _parse_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    if parts.scheme != "tcp":
        raise ValueError(f"governed URL must be tcp://HOST:PORT, got {url!r}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"governed URL needs a host and a port, got {url!r}")
    return parts.hostname, parts.port


# Idle connections kept per server for attempts that need one to themselves.
_MAX_IDLE_EXCLUSIVE = 32
# Replies a stream's consumer may leave unread before its connection's reader waits.
STREAM_BUFFER = 64


class _Connection:
    """One TCP connection and the requests waiting on it."""

    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        max_frame_bytes: int,
        *,
        endpoint: _Endpoint | None = None,
        exclusive: bool = False,
    ) -> None:
        self.stream = stream
        self.endpoint = endpoint
        self.max_frame_bytes = max_frame_bytes
        self.waiters: dict[str, MemoryObjectSendStream[Reply]] = {}
        self.send_lock = anyio.Lock()
        self.failure: YieldgateError | None = None
        self.draining = False
        # One request at a time, closed to cancel it (see the module's docstring).
        self.exclusive = exclusive

    @property
    def broken(self) -> bool:
        """No new request may use it (it failed, or the server stopped reading it)."""
        return self.failure is not None or self.draining

    async def send(self, data: bytes) -> None:
        try:
            async with self.send_lock:
                await self.stream.send(data)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            error = self.failure or TransportError(f"connection lost while sending: {exc!r}")
            # Closing it also ends the reader, instead of waiting for the server to.
            await self.close(error)
            raise _fresh(error) from exc

    async def close(self, error: YieldgateError) -> None:
        """Fail the connection with ``error`` and close its socket, even when cancelled."""
        self.fail(error)
        with anyio.CancelScope(shield=True):
            await self.stream.aclose()

    def fail(self, error: YieldgateError) -> None:
        """Mark the connection dead and end every pending request's reply stream."""
        if self.failure is None:
            self.failure = error
        for waiter in self.waiters.values():
            waiter.close()
        self.waiters.clear()

    async def read_loop(self) -> None:
        buf = bytearray()
        try:
            while True:
                data = await self.stream.receive(65536)
                buf += data
                start = 0
                while (nl := buf.find(b"\n", start)) >= 0:
                    reply = decode_reply(bytes(buf[start:nl]))
                    start = nl + 1
                    waiter = self._dispatch(reply)
                    if waiter is not None:
                        # A stream's own connection: wait for its consumer to
                        # make room, so that the server feels a slow reader.
                        with contextlib.suppress(
                            anyio.BrokenResourceError, anyio.ClosedResourceError
                        ):
                            await waiter.send(reply)
                del buf[:start]
                if self.draining and not self.waiters:
                    return  # everything it carried is answered: close it
                self._check_size(buf)
        except ProtocolError as exc:
            self.fail(ProtocolError(f"server sent an invalid reply: {exc.message}"))
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            self.fail(TransportError("connection closed by the server"))
        except Exception as exc:
            # Whatever a reply does to the decoder, it must not reach the user's task group.
            self.fail(ProtocolError(f"server sent a reply that could not be read: {exc!r}"))
        finally:
            await self.close(TransportError("connection closed"))

    def _check_size(self, pending: bytearray) -> None:
        if len(pending) > self.max_frame_bytes:
            raise ProtocolError(f"reply longer than {self.max_frame_bytes} bytes")

    def _dispatch(self, reply: Reply) -> MemoryObjectSendStream[Reply] | None:
        """Hand ``reply`` to its request; the waiter to ``await send`` to, if it must wait."""
        if reply.id is None:
            assert isinstance(reply, ErrorReply)
            if reply.code == ErrorCode.FRAME_TOO_LARGE:
                # The server reads no more from this connection but answers what
                # it admitted; new requests go to a new connection.
                self.draining = True
            return None
        waiter = self.waiters.get(reply.id)
        if waiter is None:
            return None  # a request we stopped waiting for (timed out, stream abandoned)
        if self.exclusive:
            return waiter
        # A plain submit's one reply: a server that sends more gets them dropped.
        with contextlib.suppress(anyio.WouldBlock, anyio.BrokenResourceError):
            waiter.send_nowait(reply)
        return None


class _Endpoint:
    """One server: its shared connection and the idle exclusive ones."""

    def __init__(self, url: str) -> None:
        self.host, self.port = _parse_url(url)
        self.url = _address(self.host, self.port)
        self.conn: _Connection | None = None
        self.idle: list[_Connection] = []
        self.connect_lock = anyio.Lock()


class GovernedClient:
    """A client of a governed server, with backpressure from its Gate.

    >>> async with GovernedClient("tcp://127.0.0.1:7070") as client:  # doctest: +SKIP
    ...     result = await client.submit("a prompt", params={"max_tokens": 32})

    ``gate`` defaults to a fresh ``Gate`` named after the URL; share one Gate
    between clients of the same server. ``auth`` is the server's shared
    secret, if it has one. ``connect_timeout`` limits opening a connection,
    in seconds (a ``TransportError`` past it, retried like any other).

    ``url`` may be a list of servers that can each serve any request
    (replicas): the Gate then treats them as its upstream set, each with its
    own window and breaker, and sends every attempt to the cheapest one that
    is open (a Gate passed in must have been built with ``upstreams=``; the
    URLs are added to it).
    """

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        gate: Gate | None = None,
        auth: str | None = None,
        connect_timeout: float = 10.0,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("GovernedClient needs at least one URL")
        if not connect_timeout > 0:
            raise ValueError(f"connect_timeout must be > 0 seconds, got {connect_timeout!r}")
        self._endpoints: dict[str, _Endpoint] = {}
        for one in urls:
            endpoint = _Endpoint(one)
            self._endpoints.setdefault(endpoint.url, endpoint)
        first = next(iter(self._endpoints.values()))
        self.host, self.port, self.url = first.host, first.port, first.url
        self._default = first
        several = len(self._endpoints) > 1
        if gate is None:
            names = list(self._endpoints) if several else None
            gate = Gate(name=self.url, upstreams=names and {u: u for u in names})
        if several or gate.upstreams:
            for name in self._endpoints:
                gate.add_upstream(name, name)
        self.gate = gate
        self._auth = auth
        self._connect_timeout = connect_timeout
        self._max_frame_bytes = max_frame_bytes
        self._ids = itertools.count(1)
        self._open: set[_Connection] = set()
        self._tasks: anyio.abc.TaskGroup | None = None
        self._exit: contextlib.AsyncExitStack | None = None
        self._state = "new"

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> GovernedClient:
        if self._state != "new":
            raise GateClosedError("a GovernedClient can be entered only once")
        self._state = "open"
        self._exit = contextlib.AsyncExitStack()
        self._tasks = await self._exit.enter_async_context(anyio.create_task_group())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        if self._exit is not None:
            exit_stack, self._exit = self._exit, None
            await exit_stack.aclose()

    async def aclose(self) -> None:
        """Close the connection; pending requests fail with ``TransportError``.

        Safe from any task; the client's own tasks end when its ``async with``
        block does.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        for conn in list(self._open):
            # Closing the stream ends the reader task. (The task group's scope
            # wraps the user's own block: cancelling it would cancel them too.)
            await conn.close(TransportError("client closed"))

    def _check_open(self) -> None:
        if self._state != "open":
            message = (
                "use the client as `async with GovernedClient(...) as client:`"
                if self._state == "new"
                else "client is closed"
            )
            raise GateClosedError(message)

    def _endpoint(self, attempt: AttemptInfo | None) -> _Endpoint:
        if attempt is None or attempt.upstream is None:
            return self._default
        where = attempt.target if attempt.target is not None else attempt.upstream
        endpoint = self._endpoints.get(where) if isinstance(where, str) else None
        if endpoint is None and isinstance(where, str):
            # Named without the scheme, say: compare the normalised address.
            with contextlib.suppress(ValueError):
                endpoint = self._endpoints.get(_address(*_parse_url(where)))
        if endpoint is None:
            raise ValueError(
                f"the Gate chose upstream {attempt.upstream!r} ({where!r}), "
                f"which is not one of this client's URLs {list(self._endpoints)}"
            )
        return endpoint

    async def _connect(self, endpoint: _Endpoint, *, exclusive: bool) -> _Connection:
        self._check_open()
        stream: anyio.abc.SocketStream | None = None
        try:
            with anyio.move_on_after(self._connect_timeout):
                stream = await anyio.connect_tcp(endpoint.host, endpoint.port)
        except OSError as exc:  # refused, unreachable, or the kernel's own timeout
            raise TransportError(f"cannot connect to {endpoint.url}: {exc}") from exc
        if stream is None:
            raise TransportError(
                f"cannot connect to {endpoint.url}: no connection within "
                f"connect_timeout={self._connect_timeout:g} s"
            )
        conn = _Connection(stream, self._max_frame_bytes, endpoint=endpoint, exclusive=exclusive)
        self._open.add(conn)
        assert self._tasks is not None
        self._tasks.start_soon(self._read, conn)
        return conn

    async def _read(self, conn: _Connection) -> None:
        try:
            await conn.read_loop()
        finally:
            self._open.discard(conn)

    async def _connection(self, endpoint: _Endpoint) -> _Connection:
        conn = endpoint.conn
        if conn is not None and not conn.broken:
            return conn
        async with endpoint.connect_lock:
            if endpoint.conn is not None and not endpoint.conn.broken:
                return endpoint.conn
            endpoint.conn = await self._connect(endpoint, exclusive=False)
            return endpoint.conn

    async def _exclusive(self, endpoint: _Endpoint) -> _Connection:
        while endpoint.idle:
            conn = endpoint.idle.pop()
            if not conn.broken:
                return conn
        return await self._connect(endpoint, exclusive=True)

    # -- one request --------------------------------------------------------

    def _next_id(self) -> str:
        return format(next(self._ids), "x")

    async def _open_request(
        self, frame: dict[str, Any], *, stream: bool = False
    ) -> tuple[_Connection, str, MemoryObjectReceiveStream[Reply]]:
        data = encode_frame(frame)
        if len(data) - 1 > self._max_frame_bytes:
            raise _FrameTooLargeError(
                f"a {len(data) - 1}-byte frame exceeds max_frame_bytes={self._max_frame_bytes} "
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
            await self._finish_request(conn, rid, receive, complete=False)
            raise
        return conn, rid, receive

    @staticmethod
    async def _next_reply(conn: _Connection, receive: MemoryObjectReceiveStream[Reply]) -> Reply:
        try:
            return await receive.receive()
        except anyio.EndOfStream:
            failure = conn.failure or TransportError("connection closed")
            raise _fresh(failure) from failure

    async def _finish_request(
        self,
        conn: _Connection,
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
            elif not complete and not conn.broken and self._state == "open":
                self._send_cancel(conn, rid)
            return
        if complete and not conn.broken and self._state == "open":
            endpoint = conn.endpoint
            if endpoint is not None and len(endpoint.idle) < _MAX_IDLE_EXCLUSIVE:
                endpoint.idle.append(conn)
                return
        await conn.close(TransportError("request abandoned"))

    def _send_cancel(self, conn: _Connection, rid: str) -> None:
        """Ask the server to stop ``rid`` (protocol 1.1), from the client's own task
        group: the caller leaving (often cancelled itself) never waits on the send."""
        assert self._tasks is not None
        data = encode_frame(cancel_frame(rid, auth=self._auth))

        async def send() -> None:
            # A connection that broke meanwhile cancelled everything on it anyway.
            with contextlib.suppress(YieldgateError):
                await conn.send(data)

        self._tasks.start_soon(send)

    async def _ask(self, frame: dict[str, Any]) -> Reply:
        conn, rid, receive = await self._open_request(frame)
        complete = False
        try:
            reply = await self._next_reply(conn, receive)
            complete = not isinstance(reply, ChunkReply)
            return reply
        finally:
            await self._finish_request(conn, rid, receive, complete=complete)

    def _submit_frame(
        self, body: str, priority: Priority, params: Mapping[str, Any] | None, stream: bool
    ) -> dict[str, Any]:
        # The budget travels with the work, so the server stops what nobody will
        # wait for, however the client left: a plain submit's is its attempt's; a
        # stream goes on past its attempt (its first chunk), so it carries what is
        # left of the whole call (a long generation is not cut at attempt_s).
        attempt = current_attempt()
        if attempt is None:
            remaining = None
        elif stream:
            remaining = attempt.call_remaining_s()
        else:
            remaining = attempt.remaining_s()
        deadline_ms = None if remaining is None else max(1, int(remaining * 1000))
        return submit_frame(
            self._next_id(),
            body,
            priority=priority,
            deadline_ms=deadline_ms,
            stream=stream,
            params=params,
            auth=self._auth,
        )

    def _classify_reply(self, reply: Reply) -> Outcome:
        if isinstance(reply, OkReply):
            return Outcome.ok(reply.result)
        if isinstance(reply, YieldReply):
            # 10**400 ms is an integer JSON can carry: clamped, never an OverflowError.
            hint = sanitize_hint_s(reply.retry_hint_ms, unit_s=0.001)
            return Outcome.yielded(hint, reply.reason, value=reply)
        if isinstance(reply, ErrorReply):
            return _classify_error(reply)
        return Outcome.fatal(ProtocolError(f"unexpected {type(reply).__name__} to a submit"))

    async def _submit_attempt(
        self, body: str, priority: Priority, params: Mapping[str, Any] | None
    ) -> Outcome:
        try:
            reply = await self._ask(self._submit_frame(body, priority, params, stream=False))
        except _FrameTooLargeError as exc:
            return Outcome.fatal(exc)
        except (TransportError, ProtocolError) as exc:
            return Outcome.retryable(exc)
        if isinstance(reply, ChunkReply):
            return Outcome.fatal(ProtocolError("server streamed a reply that was not asked to"))
        return self._classify_reply(reply)

    # -- public API ---------------------------------------------------------

    async def submit(
        self,
        body: str,
        *,
        priority: Priority | str | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | UsePolicy | None = USE_POLICY,
    ) -> Any:
        """Submit ``body`` and return the server's result (any JSON value).

        ``priority`` defaults to that of the Gate call this runs inside (as in
        ``gate.map(client.submit, items, priority="low")``), else ``normal``.
        ``timeout`` bounds the whole call, retries included: by default the
        Gate's policy, ``None`` for no limit. Raises a ``YieldgateError`` when
        it cannot succeed.
        """
        self._check_open()
        prio = self._priority(priority)
        return await self.gate.call(
            self._submit_attempt, body, prio, params, priority=prio, timeout=timeout
        )

    @contextlib.asynccontextmanager
    async def stream(
        self,
        body: str,
        *,
        priority: Priority | str | None = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | UsePolicy | None = USE_POLICY,
    ) -> AsyncIterator[GovernedStream]:
        """Submit ``body`` as a stream; iterate the chunks' ``data`` as they come.

        >>> async with client.stream("prompt") as chunks:  # doctest: +SKIP
        ...     async for piece in chunks:
        ...         print(piece)
        ...     print(chunks.result)

        Yields and failures before the first chunk are retried (and hedged)
        like any call; once a chunk has arrived, a failure raises
        ``StreamInterruptedError`` with the chunks received so far (a retry
        would repeat output). The Gate's window slot is held until the block
        exits; leaving the block before the end cancels the rest. ``priority``
        defaults as for ``submit``.
        """
        self._check_open()
        prio = self._priority(priority)
        async with self.gate.hold(
            self._stream_attempt,
            body,
            prio,
            params,
            priority=prio,
            timeout=timeout,
            discard=self._discard_opened,
        ) as opened:
            conn, rid, receive, first = opened
            chunks = GovernedStream(self, conn, rid, receive, first)
            try:
                yield chunks
            finally:
                await self._finish_request(conn, rid, receive, complete=chunks.complete)

    def _priority(self, priority: Priority | str | None) -> Priority:
        if priority is not None:
            return Priority(priority)
        outer = self.gate._outer_priority()
        return Priority.NORMAL if outer is None else outer

    async def _discard_opened(self, opened: Any) -> None:
        conn, rid, receive, first = opened
        await self._finish_request(conn, rid, receive, complete=isinstance(first, OkReply))

    async def _stream_attempt(
        self, body: str, priority: Priority, params: Mapping[str, Any] | None
    ) -> Outcome:
        frame = self._submit_frame(body, priority, params, stream=True)
        try:
            conn, rid, receive = await self._open_request(frame, stream=True)
        except _FrameTooLargeError as exc:
            return Outcome.fatal(exc)
        except (TransportError, ProtocolError) as exc:
            return Outcome.retryable(exc)
        try:
            first = await self._next_reply(conn, receive)
        except (TransportError, ProtocolError) as exc:
            await self._finish_request(conn, rid, receive, complete=False)
            return Outcome.retryable(exc)
        except BaseException:
            await self._finish_request(conn, rid, receive, complete=False)
            raise
        if isinstance(first, ChunkReply | OkReply):
            return Outcome.ok((conn, rid, receive, first))
        await self._finish_request(conn, rid, receive, complete=True)
        return self._classify_reply(first)

    async def stats(self) -> dict[str, Any]:
        """The server's counters (the ``stats`` op), without going through the Gate."""
        self._check_open()
        reply = await self._ask(stats_frame(self._next_id(), auth=self._auth))
        if isinstance(reply, StatsReply):
            return dict(reply.counters)
        raise _reply_error(reply, "stats")

    async def ping(self) -> float:
        """Round-trip time to the server in seconds (the ``ping`` op)."""
        self._check_open()
        started = anyio.current_time()
        reply = await self._ask(ping_frame(self._next_id(), auth=self._auth))
        if isinstance(reply, PongReply):
            return anyio.current_time() - started
        raise _reply_error(reply, "ping")


class GovernedStream:
    """The chunks of one streamed submit, as an async iterator of their ``data``.

    After the iteration ends, ``result`` holds the terminal ``ok`` reply's
    result, ``chunks`` how many chunks arrived and ``received`` their data.
    A failure after the first chunk raises ``StreamInterruptedError``, which
    carries ``received`` as its ``chunks``.
    """

    def __init__(
        self,
        client: GovernedClient,
        conn: _Connection,
        rid: str,
        receive: MemoryObjectReceiveStream[Reply],
        first: Reply,
    ) -> None:
        self._client = client
        self._conn = conn
        self._rid = rid
        self._receive = receive
        self._next: Reply | None = first
        self._done = False
        self.complete = False
        self.result: Any = None
        self.chunks = 0
        self.received: list[Any] = []

    def __aiter__(self) -> GovernedStream:
        return self

    async def __anext__(self) -> Any:
        if self._done:
            raise StopAsyncIteration
        reply = self._next
        self._next = None
        if reply is None:
            try:
                reply = await self._client._next_reply(self._conn, self._receive)
            except YieldgateError as exc:
                self._done = True
                raise self._interrupted(exc) from exc
        if isinstance(reply, ChunkReply):
            self.chunks += 1
            self.received.append(reply.data)
            return reply.data
        self._done = True
        self.complete = True
        if isinstance(reply, OkReply):
            self.result = reply.result
            raise StopAsyncIteration
        error = self._client._classify_reply(reply).error
        if not isinstance(error, YieldgateError):
            error = ProtocolError(f"stream ended with an unexpected {type(reply).__name__}")
        if not self.chunks:
            raise error  # nothing was delivered (an ok-less first reply cannot get here)
        raise self._interrupted(error) from error

    def _interrupted(self, error: YieldgateError) -> StreamInterruptedError:
        return StreamInterruptedError(
            f"stream failed after {self.chunks} chunk(s), which were delivered and are "
            f"not repeated: {error.message}",
            chunks=list(self.received),
        )


def _fresh(error: YieldgateError) -> YieldgateError:
    """A new exception per waiter: one shared instance would mix their tracebacks."""
    if isinstance(error, TransportError | ProtocolError):
        return type(error)(error.message)
    return error


def _classify_error(reply: ErrorReply) -> Outcome:
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


def _reply_error(reply: Reply, op: str) -> YieldgateError:
    if isinstance(reply, ErrorReply):
        return RemoteError(
            f"{op} failed: {reply.code}: {reply.message}",
            code=reply.code,
            retryable=reply.retryable,
        )
    return ProtocolError(f"unexpected {type(reply).__name__} to {op}")

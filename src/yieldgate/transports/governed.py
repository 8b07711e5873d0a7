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

This module holds the client, which turns calls into Gate attempts. One
connection and its reader are in ``_governed_connection``, the connections of
one client and a request's trip over them in ``_governed_pool``, what a reply
means to the Gate in ``_governed_outcome``, and ``GovernedStream`` in
``_governed_stream``.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import anyio

from yieldgate._exceptions import ProtocolError, TransportError
from yieldgate.gate import USE_POLICY, Gate, Outcome, UsePolicy, current_attempt
from yieldgate.protocol import (
    DEFAULT_MAX_FRAME_BYTES,
    ChunkReply,
    OkReply,
    PongReply,
    Priority,
    StatsReply,
    ping_frame,
    stats_frame,
    submit_frame,
)
from yieldgate.transports._governed_connection import next_reply
from yieldgate.transports._governed_outcome import classify_reply, reply_error
from yieldgate.transports._governed_pool import STREAM_BUFFER as STREAM_BUFFER
from yieldgate.transports._governed_pool import FrameTooLargeError, Pool
from yieldgate.transports._governed_stream import GovernedStream

__all__ = ["GovernedClient", "GovernedStream"]


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
        self._pool = Pool(
            urls, auth=auth, connect_timeout=connect_timeout, max_frame_bytes=max_frame_bytes
        )
        first = self._pool.default
        self.host, self.port, self.url = first.host, first.port, first.url
        several = len(self._pool.endpoints) > 1
        if gate is None:
            names = list(self._pool.endpoints) if several else None
            gate = Gate(name=self.url, upstreams=names and {u: u for u in names})
        if several or gate.upstreams:
            for name in self._pool.endpoints:
                gate.add_upstream(name, name)
        self.gate = gate
        """The Gate every submit runs through (one of its own unless one was given)."""
        self._auth = auth
        self._ids = itertools.count(1)
        self._exit: contextlib.AsyncExitStack | None = None

    # -- lifecycle ----------------------------------------------------------

    async def __aenter__(self) -> GovernedClient:
        self._pool.start()
        self._exit = contextlib.AsyncExitStack()
        self._pool.tasks = await self._exit.enter_async_context(anyio.create_task_group())
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
        await self._pool.aclose()

    # -- one request --------------------------------------------------------

    def _next_id(self) -> str:
        return format(next(self._ids), "x")

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

    async def _submit_attempt(
        self, body: str, priority: Priority, params: Mapping[str, Any] | None
    ) -> Outcome:
        try:
            reply = await self._pool.ask(self._submit_frame(body, priority, params, stream=False))
        except FrameTooLargeError as exc:
            return Outcome.fatal(exc)
        except (TransportError, ProtocolError) as exc:
            return Outcome.retryable(exc)
        if isinstance(reply, ChunkReply):
            return Outcome.fatal(ProtocolError("server streamed a reply that was not asked to"))
        return classify_reply(reply)

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
        self._pool.check_open()
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
        self._pool.check_open()
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
            chunks = GovernedStream(conn, rid, receive, first)
            try:
                yield chunks
            finally:
                await self._pool.finish_request(conn, rid, receive, complete=chunks.complete)

    def _priority(self, priority: Priority | str | None) -> Priority:
        if priority is not None:
            return Priority(priority)
        outer = self.gate._outer_priority()
        return Priority.NORMAL if outer is None else outer

    async def _discard_opened(self, opened: Any) -> None:
        conn, rid, receive, first = opened
        await self._pool.finish_request(conn, rid, receive, complete=isinstance(first, OkReply))

    async def _stream_attempt(
        self, body: str, priority: Priority, params: Mapping[str, Any] | None
    ) -> Outcome:
        frame = self._submit_frame(body, priority, params, stream=True)
        try:
            conn, rid, receive = await self._pool.open_request(frame, stream=True)
        except FrameTooLargeError as exc:
            return Outcome.fatal(exc)
        except (TransportError, ProtocolError) as exc:
            return Outcome.retryable(exc)
        try:
            first = await next_reply(conn, receive)
        except (TransportError, ProtocolError) as exc:
            await self._pool.finish_request(conn, rid, receive, complete=False)
            return Outcome.retryable(exc)
        except BaseException:
            await self._pool.finish_request(conn, rid, receive, complete=False)
            raise
        if isinstance(first, ChunkReply | OkReply):
            return Outcome.ok((conn, rid, receive, first))
        await self._pool.finish_request(conn, rid, receive, complete=True)
        return classify_reply(first)

    async def stats(self) -> dict[str, Any]:
        """The server's counters (the ``stats`` op), without going through the Gate."""
        self._pool.check_open()
        reply = await self._pool.ask(stats_frame(self._next_id(), auth=self._auth))
        if isinstance(reply, StatsReply):
            return dict(reply.counters)
        raise reply_error(reply, "stats")

    async def ping(self) -> float:
        """Round-trip time to the server in seconds (the ``ping`` op)."""
        self._pool.check_open()
        started = anyio.current_time()
        reply = await self._pool.ask(ping_frame(self._next_id(), auth=self._auth))
        if isinstance(reply, PongReply):
            return anyio.current_time() - started
        raise reply_error(reply, "ping")

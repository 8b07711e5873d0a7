"""One TCP connection of a ``GovernedClient``, the requests waiting on it, and its server.

Its reader task splits what arrives into reply lines and hands each to the
request with that ``id``, through the request's memory stream. On the shared
connection a plain submit takes one reply and never makes the reader wait. An
exclusive connection carries one request (a stream, or a hedged attempt): there
the reader waits for the consumer to make room, so that a slow consumer stops
the reads and TCP's flow control reaches the server.

A reply without an ``id`` that says ``frame_too_large`` makes the connection
drain: it takes no new requests and ends once what it carries is answered. A
broken connection ends every waiting request's stream; ``next_reply`` then
raises the connection's failure (a copy of its own for each waiter).

An ``Endpoint`` is one server (its address, its shared connection, its idle
exclusive ones). It lives here, with ``Connection``, because each names the
other: an exclusive connection goes back to its endpoint's idle list. The pool
(``_governed_pool``), which holds the endpoints, imports both.
"""

from __future__ import annotations

import contextlib
from urllib.parse import urlsplit

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from yieldgate._exceptions import ProtocolError, TransportError, YieldgateError
from yieldgate.protocol import ErrorCode, ErrorReply, Reply, decode_reply

__all__ = ["Connection", "Endpoint", "address", "fresh", "next_reply", "parse_url"]


class Connection:
    """One TCP connection and the requests waiting on it."""

    def __init__(
        self,
        stream: anyio.abc.SocketStream,
        max_frame_bytes: int,
        *,
        endpoint: Endpoint | None = None,
        exclusive: bool = False,
    ) -> None:
        self.stream = stream
        self.endpoint = endpoint
        self.max_frame_bytes = max_frame_bytes
        self.waiters: dict[str, MemoryObjectSendStream[Reply]] = {}
        self.send_lock = anyio.Lock()
        self.failure: YieldgateError | None = None
        self.draining = False
        # One request at a time, closed to cancel it (see yieldgate.transports.governed).
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
            raise fresh(error) from exc

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


async def next_reply(conn: Connection, receive: MemoryObjectReceiveStream[Reply]) -> Reply:
    """The next reply on ``receive``, a request's stream on ``conn``; once the
    connection has ended it, the connection's failure."""
    try:
        return await receive.receive()
    except anyio.EndOfStream:
        failure = conn.failure or TransportError("connection closed")
        raise fresh(failure) from failure


def fresh(error: YieldgateError) -> YieldgateError:
    """A new exception per waiter: one shared instance would mix their tracebacks."""
    if isinstance(error, TransportError | ProtocolError):
        return type(error)(error.message)
    return error


def address(host: str, port: int) -> str:
    """The one spelling of a server's URL: an endpoint's name and key."""
    return f"tcp://{host}:{port}"


def parse_url(url: str) -> tuple[str, int]:
    parts = urlsplit(url if "://" in url else f"tcp://{url}")
    if parts.scheme != "tcp":
        raise ValueError(f"governed URL must be tcp://HOST:PORT, got {url!r}")
    if parts.hostname is None or parts.port is None:
        raise ValueError(f"governed URL needs a host and a port, got {url!r}")
    return parts.hostname, parts.port


class Endpoint:
    """One server: its shared connection and the idle exclusive ones."""

    def __init__(self, url: str) -> None:
        self.host, self.port = parse_url(url)
        self.url = address(self.host, self.port)
        self.conn: Connection | None = None
        self.idle: list[Connection] = []
        self.connect_lock = anyio.Lock()

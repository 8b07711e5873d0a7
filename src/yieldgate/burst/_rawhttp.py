"""A lean HTTP/1.1 client for load generation: the ``raw+http://`` target.

The official clients (openai's, httpx, httpcore) spend about 1.8 ms of CPU
on one chat completion; a load generator that measures a server must spend
far less than the server does. This client does only what a burst needs:

- asyncio streams, HTTP/1.1 keep-alive: a pool of idle connections, one
  connection per request in flight, reused; a reused connection the server
  had closed is replaced once, transparently, before any byte came back;
- the request's bytes built once per request from a prebuilt head and body
  template (only the prompt, ``max_tokens`` and the priority vary);
- a minimal response parser: the status line, the headers (``content-length``,
  ``transfer-encoding: chunked``, ``connection``, and whatever a dialect reads:
  ``retry-after``, ``retry-after-ms``, ``x-should-retry``, rate-limit and
  ``x-yieldgate-*`` headers), the body;
- streaming (``stream: true``): server-sent events over a chunked body, one
  ``Request.chunk()`` per event that carries content, as the openai client's
  target counts them.

Every request goes through the run's Gate (``gate.call_and_hold``), and the
reply is classified by the dialect the HTTP transport uses (``openai`` by
default): ``RawResponse`` has the ``status_code``, ``headers`` and ``content``
a dialect reads, so the rules are the same ones, not a copy. No
``Idempotency-Key`` is sent (the server under test does not deduplicate).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import yieldgate
from yieldgate.dialects import get_dialect
from yieldgate.gate import USE_POLICY
from yieldgate.gate._window import Signal
from yieldgate.protocol import PRIORITY_HEADER

__all__ = ["ConnectionPool", "RawResponse", "open_raw", "read_response"]

_MAX_HEAD = 64 * 1024


class Headers(dict[str, str]):
    """Response headers, names stored in lower case and looked up case-insensitively."""

    __slots__ = ()

    def get(self, name: str, default: Any = None) -> Any:
        # Callers mostly ask in lower case already (yieldgate._headers): no copy then.
        value = dict.get(self, name)
        if value is None and not name.islower():
            return dict.get(self, name.lower(), default)
        return default if value is None else value

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and dict.__contains__(self, name.lower())


class RawResponse:
    """One HTTP response, as a dialect reads it (``yieldgate.dialects.ResponseLike``).

    ``content`` is the whole body, except for a streamed 2xx reply, whose body
    is still on ``connection`` (read it with ``events``).
    """

    __slots__ = ("connection", "content", "headers", "reusable", "status_code")

    def __init__(self, status_code: int, headers: Headers) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = b""
        self.reusable = headers.get("connection", "").lower() != "close"
        self.connection: Connection | None = None

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()


class ProtocolError(ConnectionError):
    """The server's bytes are not HTTP/1.1 as this client reads it."""


def parse_head(head: bytes) -> RawResponse:
    """The status and headers of a response head (ending with an empty line)."""
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0]
    if not status_line.startswith("HTTP/1.") or len(status_line) < 12:
        raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:40]!r}")
    try:
        status = int(status_line[9:12])
    except ValueError:
        raise ProtocolError(f"bad status line: {status_line[:40]!r}") from None
    headers = Headers()
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line: {line[:40]!r}")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers)


async def read_head(reader: asyncio.StreamReader) -> RawResponse:
    """Read a response's head; a ``100 Continue`` interim response is skipped."""
    while True:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProtocolError("response head too long") from None
        response = parse_head(head)
        if response.status_code != 100:
            return response


async def read_chunks(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """The pieces of a chunked body, trailers skipped."""
    while True:
        line = await reader.readuntil(b"\r\n")
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size: {line[:20]!r}") from None
        if size == 0:
            while await reader.readuntil(b"\r\n") != b"\r\n":
                pass  # a trailer field
            return
        data = await reader.readexactly(size + 2)
        if data[-2:] != b"\r\n":
            raise ProtocolError("a chunk does not end with CRLF")
        yield data[:-2]


async def read_body(reader: asyncio.StreamReader, response: RawResponse) -> bytes:
    """The whole body of ``response``; without a length or chunking, up to the end of the
    connection (which is then not reused)."""
    length = response.headers.get("content-length")
    if response.chunked:
        return b"".join([piece async for piece in read_chunks(reader)])
    if length is not None:
        try:
            size = int(length)
        except ValueError:
            raise ProtocolError(f"bad content-length: {length[:20]!r}") from None
        return await reader.readexactly(size) if size else b""
    if response.status_code in (204, 304):
        return b""
    response.reusable = False
    return await reader.read()


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """One whole response: head and body."""
    response = await read_head(reader)
    response.content = await read_body(reader, response)
    return response


class Connection:
    """One keep-alive connection."""

    __slots__ = ("reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.used = False  # served a response before: may have been closed by the server

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class ConnectionPool:
    """Idle keep-alive connections to one ``host:port``; one per request in flight."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._idle: list[Connection] = []
        self.opened = 0  # connections ever opened (tests read it)

    async def _open(self) -> Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=_MAX_HEAD)
        self.opened += 1
        return Connection(reader, writer)

    async def exchange(self, data: bytes, *, stream: bool = False) -> RawResponse:
        """Send ``data`` (one request) and read the reply. A 2xx reply to a ``stream``
        request keeps its connection (``response.connection``): pass it to ``release``
        after reading its body; every other reply has its body read and its connection
        back in the pool."""
        idle = self._idle
        while True:
            connection = idle.pop() if idle else await self._open()
            try:
                connection.writer.write(data)
                response = await read_head(connection.reader)
                if stream and 200 <= response.status_code < 300:
                    response.connection = connection
                    return response
                response.content = await read_body(connection.reader, response)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                connection.close()
                if connection.used and not isinstance(exc, ProtocolError):
                    continue  # a kept-alive connection the server had closed: a fresh one
                raise
            except BaseException:
                connection.close()  # cancelled half-way: its state is unknown
                raise
            self.release(connection, response.reusable)
            return response

    def release(self, connection: Connection, reusable: bool) -> None:
        if reusable and not connection.reader.at_eof():
            connection.used = True
            self._idle.append(connection)
        else:
            connection.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        for connection in idle:
            with contextlib.suppress(Exception):
                await connection.writer.wait_closed()


class ChatRequests:
    """The bytes of chat completion requests, built from a prebuilt head and body."""

    def __init__(
        self, host: str, port: int, path: str, model: str, *, stream: bool, max_tokens: int | None
    ) -> None:
        self._line = (
            f"POST {path}/v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
            "Content-Type: application/json\r\nAccept: */*\r\n"
        ).encode("ascii")
        self._open = (
            b'{"model": ' + json.dumps(model).encode() + b', "messages": [{"role": "user", '
            b'"content": '
        )
        self._stream = b', "stream": true' if stream else b""
        self._max_tokens = max_tokens
        self._tails: dict[int | None, bytes] = {}

    def _tail(self, max_tokens: int | None) -> bytes:
        tail = self._tails.get(max_tokens)
        if tail is None:
            extra = b"" if max_tokens is None else b', "max_tokens": %d' % max_tokens
            tail = self._tails[max_tokens] = b"}]" + extra + self._stream + b"}"
        return tail

    def build(self, prompt: str, max_tokens: int | None, priority: str | None) -> bytes:
        body = self._open + json.dumps(prompt).encode() + self._tail(max_tokens)
        extra = b"" if priority is None else f"{PRIORITY_HEADER}: {priority}\r\n".encode("ascii")
        return self._line + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body


def _content_events(piece: bytes, pending: bytearray) -> int:
    """Events carrying content in ``piece`` of a server-sent event stream (``pending``
    holds an incomplete last line between calls)."""
    pending += piece
    *lines, rest = bytes(pending).split(b"\n")
    pending[:] = rest
    count = 0
    for line in lines:
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        try:
            event = json.loads(data)
        except ValueError:
            continue
        choices = event.get("choices") if isinstance(event, dict) else None
        if choices and (choices[0].get("delta") or {}).get("content"):
            count += 1
    return count


async def _discard(response: RawResponse) -> None:
    """A streamed reply the Gate dropped (a hedge that won too late): its connection goes."""
    if response.connection is not None:
        response.connection.close()


@contextlib.asynccontextmanager
async def open_raw(
    target: Any, gate: yieldgate.Gate, workload: Any, dialect: str
) -> AsyncIterator[Any]:
    """The ``send`` of a ``raw+http://`` target (see ``_targets.open_target``)."""
    assert target.port is not None
    classify = get_dialect(dialect)
    pool = ConnectionPool(target.host, target.port)
    requests = ChatRequests(
        target.host,
        target.port,
        target.path,
        workload.model,
        stream=workload.stream,
        max_tokens=workload.max_tokens,
    )
    stream = workload.stream
    timeout = USE_POLICY if workload.timeout_s is None else workload.timeout_s
    default_max = workload.max_tokens

    async def attempt(data: bytes) -> RawResponse:
        return await pool.exchange(data, stream=stream)

    async def send(prompt: str, request: Any) -> None:
        request.restart()
        max_tokens = request.max_tokens if request.max_tokens is not None else default_max
        data = requests.build(prompt, max_tokens, request.priority)
        priority = request.priority or "normal"
        if not stream:
            await gate.call(attempt, data, priority=priority, timeout=timeout, classify=classify)
            return
        response, lease = await gate.call_and_hold(
            attempt, data, priority=priority, timeout=timeout, classify=classify, discard=_discard
        )
        connection = response.connection
        signal = Signal.CANCELLED
        try:
            assert connection is not None
            pending = bytearray()
            if response.chunked:
                async for piece in read_chunks(connection.reader):
                    for _ in range(_content_events(piece, pending)):
                        request.chunk()
            else:
                body = await read_body(connection.reader, response)
                for _ in range(_content_events(body + b"\n", pending)):
                    request.chunk()
            signal = Signal.SUCCESS
        except Exception:
            signal = Signal.FAILURE
            raise
        finally:
            lease.release(signal)
            if connection is not None:
                if signal is Signal.SUCCESS:
                    pool.release(connection, response.reusable)
                else:
                    connection.close()

    try:
        yield send
    finally:
        await pool.aclose()

"""Shared fixtures: real server processes on 127.0.0.1 (``serve``) and a raw NDJSON client.

The raw client speaks the wire format by hand (no SDK code), so the server is
tested against the protocol itself.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest

from yieldgate.protocol import encode_frame, stats_frame, submit_frame
from yieldgate.server import ServerProcess, spawn

Stats = dict[str, Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def stats_when(
    read: Callable[[], Awaitable[Stats]],
    predicate: Callable[[Stats], bool],
    timeout: float = 15.0,
) -> Stats:
    """Poll ``read()`` (a server's counters) until ``predicate`` holds; the stats then.

    There is no event to wait on across a process boundary. The timeout is
    generous: a loaded machine may be slow, and no test may depend on it being fast.
    """
    with anyio.fail_after(timeout):
        while True:
            stats = await read()
            if predicate(stats):
                return stats
            await anyio.sleep(0.02)


def send_line(sock: socket.socket, line: bytes) -> bytes:
    """Send one frame on a blocking socket and read its reply line."""
    sock.sendall(line)
    reply = bytearray()
    while not reply.endswith(b"\n"):
        data = sock.recv(65536)
        assert data, "connection closed"
        reply += data
    return bytes(reply)


def free_port() -> int:
    """A loopback port nobody listens on now: bound, then closed."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def refused_url() -> str:
    """An HTTP URL where every connection is refused."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def slow_server() -> Iterator[ServerProcess]:
    """A server whose every call takes 3 s: a call allowed less times out."""
    with spawn("--max-inflight", "2", "--exec-ms", "3000", http=True) as proc:
        yield proc


def http_stats(server: ServerProcess) -> dict[str, Any]:
    """A server's ``GET /stats`` over its HTTP front."""
    response = httpx.get(f"{server.http_url}/stats", timeout=10)
    response.raise_for_status()
    stats: dict[str, Any] = response.json()
    return stats


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerProcess]]:
    """``yieldgate.server.spawn`` for tests: every server stops at teardown, also on failure."""
    started: list[ServerProcess] = []

    def _start(*args: str, fd_limit: int | None = None) -> ServerProcess:
        server = spawn(*args, ready_timeout=30.0, fd_limit=fd_limit)
        started.append(server)
        return server

    yield _start
    for server in started:
        server.stop(timeout=5.0)


class RawClient:
    """One NDJSON connection. Replies for other ids are kept until asked for."""

    def __init__(self, stream: anyio.abc.SocketStream) -> None:
        self.stream = stream
        self._buf = bytearray()
        self._pending: list[dict[str, Any]] = []
        self._n = 0

    @classmethod
    async def connect(cls, server: ServerProcess) -> RawClient:
        return cls(await anyio.connect_tcp(server.host, server.port))

    def next_id(self) -> str:
        self._n += 1
        return f"r{self._n}"

    async def send(self, frame: dict[str, Any] | bytes) -> None:
        await self.stream.send(frame if isinstance(frame, bytes) else encode_frame(frame))

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next reply, in arrival order."""
        if self._pending:
            return self._pending.pop(0)
        return await self._read(timeout)

    async def _read(self, timeout: float) -> dict[str, Any]:
        with anyio.fail_after(timeout):
            while (nl := self._buf.find(b"\n")) < 0:
                data = await self.stream.receive()
                self._buf += data
        line = bytes(self._buf[:nl])
        del self._buf[: nl + 1]
        reply: dict[str, Any] = json.loads(line)
        return reply

    async def recv_for(self, rid: str | None, timeout: float = 10.0) -> dict[str, Any]:
        """The next terminal-or-chunk reply carrying ``rid``."""
        for i, reply in enumerate(self._pending):
            if reply.get("id") == rid:
                return self._pending.pop(i)
        while True:
            reply = await self._read(timeout)
            if reply.get("id") == rid:
                return reply
            self._pending.append(reply)

    async def request(self, frame: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
        await self.send(frame)
        return await self.recv_for(frame["id"], timeout)

    async def submit(self, body: str = "hello", timeout: float = 10.0, **kw: Any) -> dict[str, Any]:
        return await self.request(submit_frame(self.next_id(), body, **kw), timeout)

    async def stats(self) -> dict[str, Any]:
        return await self.request(stats_frame(self.next_id()))

    async def stats_when(self, predicate: Callable[[Stats], bool], timeout: float = 15.0) -> Stats:
        """Poll ``stats`` until ``predicate(stats)`` holds."""
        return await stats_when(self.stats, predicate, timeout)

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection (EOF or reset) within ``timeout``."""
        with anyio.fail_after(timeout):
            try:
                while True:
                    await self.stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                return True

    async def aclose(self) -> None:
        await self.stream.aclose()


@pytest.fixture
async def connect() -> AsyncIterator[Callable[[ServerProcess], Any]]:
    """Open raw connections to a server; all are closed at teardown."""
    clients: list[RawClient] = []

    async def _connect(server: ServerProcess) -> RawClient:
        client = await RawClient.connect(server)
        clients.append(client)
        return client

    yield _connect
    for client in clients:
        with anyio.CancelScope(shield=True):
            await client.aclose()


def submit(rid: str, body: str = "hello", **kw: Any) -> dict[str, Any]:
    """A valid submit frame (re-exported for tests that build frames by hand)."""
    return submit_frame(rid, body, **kw)


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``python -m yieldgate ARGS`` in a child process: its status, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "yieldgate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )

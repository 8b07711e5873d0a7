"""Shared fixtures: real server processes on 127.0.0.1 and a raw NDJSON client.

The raw client speaks the wire format by hand (no SDK code), so the server is
tested against the protocol itself.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import pytest

from yieldgate.protocol import encode_frame, stats_frame, submit_frame

Stats = dict[str, Any]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class ServerProcess:
    """A ``yieldgate serve`` child process; ``stderr`` collects what it logged."""

    proc: subprocess.Popen[str]
    host: str
    port: int
    stderr: list[str] = field(default_factory=list)
    http_url: str | None = None  # with --http-port: http://HOST:PORT

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout: float = 15.0) -> int:
        return self.proc.wait(timeout=timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


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


def start_server(*args: str, timeout: float = 30.0, fd_limit: int | None = None) -> ServerProcess:
    """Start ``yieldgate serve --port 0 ARGS`` and wait for its ``listening`` line(s).

    With ``--http-port`` in ``ARGS`` the second line (``listening http://...``)
    is awaited too and kept as ``http_url``. ``fd_limit`` caps the process's
    open file descriptors (``RLIMIT_NOFILE``), to run it out of them.
    """
    cmd = [sys.executable, "-m", "yieldgate", "serve", "--port", "0", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def limit_descriptors() -> None:
        if fd_limit is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (fd_limit, fd_limit))

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=limit_descriptors if fd_limit is not None else None,
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(proc.stderr), daemon=True).start()  # type: ignore[arg-type]
    expected = ["listening tcp://"]
    if "--http-port" in args:
        expected.append("listening http://")
    ready: list[str] = []

    def read_lines() -> None:
        for _ in expected:
            ready.append(proc.stdout.readline().strip())  # type: ignore[union-attr]

    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    reader.join(timeout)
    lines = list(ready)
    if len(lines) != len(expected) or not all(
        line.startswith(prefix) for line, prefix in zip(lines, expected, strict=True)
    ):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"server did not start: stdout={lines!r} stderr={''.join(stderr)!r}")
    host, _, port = lines[0].removeprefix("listening tcp://").rpartition(":")
    http_url = lines[1].removeprefix("listening ") if len(lines) > 1 else None
    return ServerProcess(proc=proc, host=host, port=int(port), stderr=stderr, http_url=http_url)


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerProcess]]:
    """Start real server processes; every one is stopped at teardown, also on failure."""
    started: list[ServerProcess] = []

    def _start(*args: str, fd_limit: int | None = None) -> ServerProcess:
        server = start_server(*args, fd_limit=fd_limit)
        started.append(server)
        return server

    yield _start
    for server in started:
        server.stop()


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

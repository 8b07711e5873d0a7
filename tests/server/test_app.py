"""The Server in-process with custom backends: what a misbehaving backend costs."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from tests.conftest import RawClient, submit
from yieldgate.protocol import sha256_hex
from yieldgate.server import Governor, GovernorConfig, Server, TcpConfig, Work
from yieldgate.server.app import format_url
from yieldgate.server.backends import BackendError, Emit

pytestmark = pytest.mark.anyio


class OddBackend:
    """Does what ``work.body`` says."""

    name = "odd"

    def __init__(self) -> None:
        self.started = anyio.Event()
        self.closed = anyio.Event()

    async def start(self, governor: Governor) -> None:
        self.started.set()

    def estimate_ms(self, work: Work) -> float | None:
        if work.body == "bad-estimate":
            raise RuntimeError("estimator bug")
        return None

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        match work.body:
            case "set":
                return {1, 2}
            case "nan":
                return float("nan")
            case "raise":
                raise RuntimeError("kaput")
            case "bad-chunk":
                assert emit is not None
                await emit({"fine": 1})
                await emit(object())
            case "hang":
                await anyio.sleep_forever()
            case "surrogate-error":
                raise BackendError(f"unknown model {work.params.get('model')}")
            case "deep":
                deep: list[Any] = []
                for _ in range(100_000):
                    deep = [deep]
                return deep
        return work.body

    async def aclose(self) -> None:
        self.closed.set()


@pytest.fixture
async def running() -> AsyncIterator[tuple[Server, OddBackend, RawClient]]:
    backend = OddBackend()
    server = Server(
        Governor(GovernorConfig(max_inflight=2)),
        backend,
        tcp=TcpConfig(port=0),
        grace_s=0.5,
    )
    async with anyio.create_task_group() as tg:
        url = await tg.start(lambda task_status: server.run(task_status=task_status))
        host, _, port = url.removeprefix("tcp://").rpartition(":")
        client = RawClient(await anyio.connect_tcp(host, int(port)))
        try:
            yield server, backend, client
        finally:
            await client.aclose()
            server.request_stop(hard=True)


@pytest.mark.parametrize("body", ["set", "nan"])
async def test_unserialisable_result_is_a_backend_error(running: Any, body: str) -> None:
    _, _, client = running
    reply = await client.submit(body)
    assert (reply["code"], reply["retryable"]) == ("backend_error", False)
    assert "JSON" in reply["message"]
    stats = await client.stats()
    assert (stats["failed_total"], stats["executed_total"], stats["inflight"]) == (1, 0, 0)
    assert (await client.submit("fine"))["result"] == "fine"


async def test_raising_backend_is_a_backend_error(running: Any) -> None:
    _, _, client = running
    reply = await client.submit("raise")
    assert (reply["code"], reply["retryable"]) == ("backend_error", False)
    assert "RuntimeError: kaput" in reply["message"]
    assert (await client.stats())["failed_total"] == 1


async def test_unserialisable_chunk_ends_the_stream_with_an_error(running: Any) -> None:
    _, _, client = running
    await client.send(submit("c", "bad-chunk", stream=True))
    first = await client.recv()
    assert (first["status"], first["seq"], first["data"]) == ("chunk", 0, {"fine": 1})
    terminal = await client.recv()
    assert (terminal["id"], terminal["code"]) == ("c", "backend_error")


async def test_backend_lifecycle(running: Any) -> None:
    server, backend, _ = running
    with anyio.fail_after(5):
        await backend.started.wait()
    assert server.stats()["connections_open"] == 1
    server.request_stop()
    with anyio.fail_after(5):
        await backend.closed.wait()


async def test_stop_requested_before_run_returns_promptly() -> None:
    server = Server(Governor(), OddBackend(), tcp=TcpConfig(port=0), grace_s=0)
    server.request_stop()
    with anyio.fail_after(5):
        await server.run()


def test_format_url() -> None:
    assert format_url("tcp", "127.0.0.1", 80) == "tcp://127.0.0.1:80"
    assert format_url("tcp", "::1", 80) == "tcp://[::1]:80"


def test_grace_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="grace_s"):
        Server(Governor(), OddBackend(), grace_s=-1)


async def fresh_client(server: Server) -> RawClient:
    """A new connection: a connection's reader picks the fast path when it starts."""
    assert server.tcp.address is not None
    return RawClient(await anyio.connect_tcp(*server.tcp.address))


async def test_submits_without_the_fast_path(running: Any) -> None:
    server, _, _ = running
    server.tcp._fast_submit = None  # as when msgspec is not installed
    client = await fresh_client(server)
    assert (await client.submit("plain"))["result"] == "plain"
    await client.send(submit("hang", "hang"))
    await client.send(submit("hang2", "hang"))
    stats = await client.stats()
    assert stats["inflight"] == 2
    refused = await client.submit("third")
    assert (refused["status"], refused["reason"]) == ("yield", "saturated")
    await client.aclose()


async def test_a_fast_path_that_raises_costs_only_that_line(running: Any) -> None:
    server, _, _ = running

    def broken(line: bytes) -> None:
        if b'"submit"' in line:
            raise RuntimeError("decoder bug")
        # anything else goes on to the reference decoder

    server.tcp._fast_submit = broken
    client = await fresh_client(server)
    await client.send(submit("s", "plain"))
    reply = await client.recv()
    assert (reply["status"], reply["code"], reply["id"]) == ("error", "bad_frame", None)
    assert (await client.stats())["errors_total"] == 1  # same connection, still served
    await client.aclose()


async def test_an_unencodable_backend_error_is_still_answered(running: Any) -> None:
    _, _, client = running
    frame = (
        b'{"op":"submit","id":"s","body":"surrogate-error","sha256":"'
        + sha256_hex("surrogate-error").encode()
        + b'","params":{"model":"\\ud800"}}\n'
    )
    await client.send(frame)
    reply = await client.recv_for("s")
    assert (reply["code"], reply["retryable"]) == ("backend_error", True)
    assert "unknown model" in reply["message"]
    assert (await client.submit("alive"))["result"] == "alive"


async def test_a_result_too_deep_to_encode_is_a_backend_error(running: Any) -> None:
    _, _, client = running
    reply = await client.submit("deep")
    assert (reply["code"], reply["retryable"]) == ("backend_error", False)
    stats = await client.stats()
    assert (stats["failed_total"], stats["cancelled_total"], stats["inflight"]) == (1, 0, 0)
    assert (await client.submit("alive"))["result"] == "alive"


async def test_an_estimator_that_raises_is_answered_with_the_id(running: Any) -> None:
    _, _, client = running
    reply = await client.submit("bad-estimate")
    assert (reply["id"], reply["code"]) == (reply["id"], "backend_error")
    assert reply["id"] is not None
    assert "estimator bug" in reply["message"]

"""Connection limits of the TCP front, against a real server process."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from tests.conftest import RawClient, ServerProcess
from yieldgate.protocol import encode_frame, submit_frame

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def test_a_slowloris_is_closed_and_costs_others_nothing(
    serve: Callable[..., ServerProcess], connect: Callable[[ServerProcess], Any]
) -> None:
    server = serve("--max-inflight", "2", "--exec-ms", "50", "--idle-timeout-s", "0.5")
    # Hundreds of connections that each send half a line, then a byte now and then.
    slow = [await anyio.connect_tcp(server.host, server.port) for _ in range(200)]
    try:
        for stream in slow:
            await stream.send(b'{"op": "sub')
        worker: RawClient = await connect(server)
        # A well-behaved client is served throughout.
        for _ in range(5):
            reply = await worker.submit("work")
            assert reply["status"] == "ok"
            for stream in slow[:50]:
                await stream.send(b"m")
        with anyio.fail_after(10):
            while True:
                stats = await worker.stats()
                if stats["connections_idle_closed_total"] >= 200:
                    break
                await anyio.sleep(0.1)
        assert stats["connections_open"] == 1
        assert stats["inflight"] == 0
        closed = 0
        for stream in slow:
            with anyio.fail_after(5):
                try:
                    if await stream.receive() == b"":
                        closed += 1
                except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
                    closed += 1
        assert closed == 200
    finally:
        for stream in slow:
            await stream.aclose()


async def test_work_in_flight_is_never_idle(
    serve: Callable[..., ServerProcess], connect: Callable[[ServerProcess], Any]
) -> None:
    server = serve("--max-inflight", "1", "--idle-timeout-s", "0.3")
    client: RawClient = await connect(server)
    # The execution outlasts the idle timeout several times over; its reply still comes.
    reply = await client.request(submit_frame("long", "x", params={"exec_ms": 1200}), timeout=10)
    assert reply["status"] == "ok"
    # Then, with nothing in flight and nothing sent, the connection is closed.
    assert await client.closed_by_peer(timeout=5)


async def test_connections_past_the_limit_are_closed_at_once(
    serve: Callable[..., ServerProcess], connect: Callable[[ServerProcess], Any]
) -> None:
    server = serve("--max-connections", "3")
    kept = [await connect(server) for _ in range(3)]
    with anyio.fail_after(5):
        while (await kept[0].stats())["connections_open"] < 3:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    extra: RawClient = await connect(server)
    assert await extra.closed_by_peer(timeout=5)
    stats = await kept[1].stats()
    assert stats["connections_refused_total"] == 1
    assert stats["connections_open"] == 3


async def test_thousands_of_connections_opened_and_closed(
    serve: Callable[..., ServerProcess], connect: Callable[[ServerProcess], Any]
) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "20")
    fd_dir = f"/proc/{server.proc.pid}/fd"
    checker: RawClient = await connect(server)
    await checker.stats()
    fds_before = len(os.listdir(fd_dir))

    async def churn(i: int) -> None:
        async with await anyio.connect_tcp(server.host, server.port) as stream:
            if i % 3 == 0:  # leave with a submit in flight (or yielded)
                await stream.send(encode_frame(submit_frame(f"c{i}", "x")))
            elif i % 3 == 1:  # leave mid-line
                await stream.send(b'{"op":"submit","id":')

    with anyio.fail_after(60):
        for start in range(0, 3000, 100):
            async with anyio.create_task_group() as tg:
                for i in range(start, start + 100):
                    tg.start_soon(churn, i)
        while True:
            stats = await checker.stats()
            if stats["connections_open"] == 1 and stats["inflight"] == 0:
                break
            await anyio.sleep(0.05)
    assert stats["connections_total"] >= 3001
    assert stats["admitted_total"] == (
        stats["executed_total"] + stats["failed_total"] + stats["cancelled_total"]
    )
    # Every descriptor came back.
    assert len(os.listdir(fd_dir)) <= fds_before + 2
    assert (await checker.submit("still here"))["status"] == "ok"

"""Connection limits of the TCP front, against a real server process."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from tests.conftest import RawClient
from yieldgate.protocol import encode_frame, submit_frame
from yieldgate.server import ServerProcess

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
                # A byte now and then; on a loaded machine the server may already have
                # closed this one for its idle time, which is the point.
                with contextlib.suppress(anyio.BrokenResourceError, ConnectionError):
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
    fd_dir = f"/proc/{server.pid}/fd"
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


# -- flow control: the write timeout (issue 16 item 12) ---------------------------

BIG_FRAME = str(32 << 20)


def stalled_reader(
    server: ServerProcess, frame: bytes, *, rcvbuf: int | None = 4096
) -> socket.socket:
    """A connection that sends ``frame`` and then reads nothing (until told to).

    A small receive buffer makes the server's writes stall after a few MB (what
    the kernel buffers on the server's side) instead of more.
    """
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((server.host, server.port))
    sock.sendall(frame)
    return sock


def big_stream(rid: str, mb: int = 8) -> bytes:
    """A stream of ``mb`` MB in 1,000 chunks over 2 s: more than the buffers hold.

    Its terminal reply carries the whole text again.
    """
    return encode_frame(
        submit_frame(rid, "x" * (mb << 20), stream=True, params={"exec_ms": 2000, "chunks": 1000})
    )


async def test_readers_that_stopped_lose_their_slots_after_the_write_timeout(
    serve: Callable[..., ServerProcess], connect: Callable[[ServerProcess], Any]
) -> None:
    # Issue 16 item 12: four streams whose readers stopped held every slot for 20 s and more.
    server = serve(
        "--max-inflight", "4", "--max-frame-bytes", BIG_FRAME, "--write-timeout-s", "0.5"
    )
    monitor: RawClient = await connect(server)
    stalled = [
        await anyio.to_thread.run_sync(stalled_reader, server, big_stream(f"s{i}"))
        for i in range(4)
    ]
    try:
        stats = await monitor.stats_when(
            lambda s: s["connections_write_timeout_total"] == 4 and s["connections_open"] == 1,
            timeout=60,
        )
        assert (stats["inflight"], stats["cancelled_total"], stats["executed_total"]) == (0, 4, 0)
        # Each stalled submit was offered its terminal reply before its connection closed.
        assert stats["errors_by_code"] == {"write_timeout": 4}
        assert stats["connections_open"] == 1
        assert stats["admitted_total"] == (
            stats["executed_total"] + stats["failed_total"] + stats["cancelled_total"]
        )
        assert (await monitor.submit("served", params={"exec_ms": 1}))["status"] == "ok"
    finally:
        for sock in stalled:
            sock.close()


async def test_a_slow_reader_that_keeps_reading_is_not_cut_off(
    serve: Callable[..., ServerProcess],
) -> None:
    server = serve(
        "--max-inflight", "1", "--max-frame-bytes", BIG_FRAME, "--write-timeout-s", "0.5"
    )
    # 4 MB in four chunks, then the 4 MB terminal reply, read at about 2.6 MB/s:
    # past what the kernel buffers, the server's writes wait on this reader for
    # seconds, and the terminal reply alone takes over a second to be read. The
    # reader takes bytes all along, so no write goes without progress for long.
    body = "x" * (4 << 20)
    frame = encode_frame(
        submit_frame("slow", body, stream=True, params={"exec_ms": 100, "chunks": 4})
    )
    sock = await anyio.to_thread.run_sync(lambda: stalled_reader(server, frame, rcvbuf=65536))

    def read_slowly() -> list[dict[str, Any]]:
        """Take at most 64 KiB every 25 ms until the terminal reply has come whole."""
        replies: list[dict[str, Any]] = []
        buf = bytearray()
        sock.settimeout(30)
        while not replies or replies[-1]["status"] == "chunk":
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            buf += data
            *lines, rest = buf.split(b"\n")
            replies += [json.loads(line) for line in lines]
            buf = bytearray(rest)
            time.sleep(0.025)
        return replies

    try:
        *chunks, terminal = await anyio.to_thread.run_sync(read_slowly)
    finally:
        sock.close()
    assert "".join(chunk["data"]["text"] for chunk in chunks) == body
    assert (terminal["id"], terminal["status"], terminal["result"]["text"]) == ("slow", "ok", body)

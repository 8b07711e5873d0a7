"""The lean HTTP client of ``raw+http://``: its parser, its pool, its Gate, and a real run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

import yieldgate
from yieldgate.burst import Target, Workload
from yieldgate.burst._rawhttp import (
    ChatRequests,
    ConnectionPool,
    ProtocolError,
    open_raw,
    parse_head,
    read_response,
)
from yieldgate.burst._strategies import Strategy
from yieldgate.burst._targets import Request, error_kind, retry_signal

pytestmark = pytest.mark.anyio

OK_BODY = b'{"choices": [{"message": {"content": "hi"}}]}'


def reader_of(data: bytes) -> asyncio.StreamReader:
    reader = asyncio.StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_content_length_body() -> None:
    reader = reader_of(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Thing: a: b\r\n\r\nhelloHTTP/1.1 204 No Content"
        b"\r\n\r\n"
    )
    response = await read_response(reader)
    assert (response.status_code, response.content) == (200, b"hello")
    assert response.headers.get("X-THING") == "a: b"  # names are case-insensitive
    assert response.reusable
    second = await read_response(reader)  # the next response on the same connection
    assert (second.status_code, second.content) == (204, b"")


async def test_chunked_body_with_extensions_and_trailers() -> None:
    reader = reader_of(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: x\r\n\r\n"
    )
    response = await read_response(reader)
    assert response.content == b"hello world"
    assert reader.at_eof() or not await reader.read()


async def test_a_body_without_length_ends_the_connection() -> None:
    response = await read_response(reader_of(b"HTTP/1.0 200 OK\r\n\r\nall of it"))
    assert response.content == b"all of it"
    assert not response.reusable
    closing = await read_response(
        reader_of(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
    )
    assert not closing.reusable


@pytest.mark.parametrize(
    "head",
    [b"SSH-2.0-x\r\n\r\n", b"HTTP/1.1 abc\r\n\r\n", b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n"],
)
def test_bad_heads_are_protocol_errors(head: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_head(head)


async def test_bad_chunk_size_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="chunk size"):
        await read_response(
            reader_of(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        )


def test_request_bytes() -> None:
    requests = ChatRequests("h", 1, "/p", "m", stream=True, max_tokens=None)
    data = requests.build('say "hi"', 8, "high")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /p/v1/chat/completions HTTP/1.1\r\nHost: h:1\r\n")
    assert b"\r\nx-yieldgate-priority: high" in head.lower()
    assert f"content-length: {len(body)}".encode() in head.lower()
    assert json.loads(body) == {
        "model": "m",
        "messages": [{"role": "user", "content": 'say "hi"'}],
        "max_tokens": 8,
        "stream": True,
    }


Handler = Callable[[bytes], bytes]


@pytest.fixture
async def scripted() -> AsyncIterator[Callable[[list[Handler]], asyncio.AbstractServer]]:
    """A server answering each request with the next reply of a script (the last one
    repeats); ``server.connections`` counts connections, ``server.bodies`` the bodies."""
    servers: list[asyncio.AbstractServer] = []

    async def start(script: list[Handler]) -> asyncio.AbstractServer:
        step = 0
        connections = 0
        bodies: list[bytes] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            nonlocal step, connections
            connections += 1
            server.connections = connections  # type: ignore[attr-defined]
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    body = await reader.readexactly(length)
                    bodies.append(body)
                    reply = script[min(step, len(script) - 1)](body)
                    step += 1
                    if not reply:  # close without answering
                        break
                    writer.write(reply)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        server.bodies = bodies  # type: ignore[attr-defined]
        server.connections = 0  # type: ignore[attr-defined]
        servers.append(server)
        return server

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()
        await server.wait_closed()


def port_of(server: asyncio.AbstractServer) -> int:
    return int(server.sockets[0].getsockname()[1])


def reply(status: str, body: bytes = OK_BODY, headers: str = "") -> Handler:
    def answer(_: bytes) -> bytes:
        return (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{headers}"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    return answer


async def test_keep_alive_reuses_one_connection(scripted: Callable[..., object]) -> None:
    server = await scripted([reply("200 OK")])  # type: ignore[misc]
    pool = ConnectionPool("127.0.0.1", port_of(server))
    requests = ChatRequests("127.0.0.1", 1, "", "m", stream=False, max_tokens=None)
    try:
        for i in range(5):
            response = await pool.exchange(requests.build(f"p{i}", None, None))
            assert (response.status_code, response.content) == (200, OK_BODY)
        assert pool.opened == 1
        assert server.connections == 1  # type: ignore[attr-defined]
        # Two at once need two connections, and both stay for later.
        await asyncio.gather(*(pool.exchange(requests.build("x", None, None)) for _ in range(2)))
        assert pool.opened == 2
    finally:
        await pool.aclose()


async def test_a_connection_the_server_closed_is_replaced(scripted: Callable[..., object]) -> None:
    server = await scripted([reply("200 OK"), lambda _: b"", reply("200 OK")])  # type: ignore[misc]
    pool = ConnectionPool("127.0.0.1", port_of(server))
    requests = ChatRequests("127.0.0.1", 1, "", "m", stream=False, max_tokens=None)
    try:
        await pool.exchange(requests.build("a", None, None))
        # The server drops the kept-alive connection on the next request: a fresh one.
        response = await pool.exchange(requests.build("b", None, None))
        assert response.status_code == 200
        assert pool.opened == 2
    finally:
        await pool.aclose()


async def test_a_refused_connection_is_an_error_the_gate_sees() -> None:
    gate = Strategy(name="naive").make_gate()
    target = Target.parse("raw+http://127.0.0.1:1")
    async with open_raw(target, gate, Workload(), "openai") as send:
        with pytest.raises(yieldgate.YieldgateError) as caught:
            await send("hello", Request(index=0, arrival_s=0.0))
    assert gate.statistics().attempts == 1
    # The Gate's verdict wraps a refused connection: the report names the cause.
    assert isinstance(caught.value, yieldgate.RetriesExhaustedError)
    assert error_kind(caught.value) == "unreachable"


async def test_a_429_with_retry_after_is_a_yield_and_waited_out(
    scripted: Callable[..., object],
) -> None:
    server = await scripted(  # type: ignore[misc]
        [
            reply(
                "429 Too Many Requests", b'{"error": {"message": "slow"}}', "Retry-After-Ms: 20\r\n"
            )
        ]
        * 2
        + [reply("200 OK")]
    )
    target = Target.parse(f"raw+http://127.0.0.1:{port_of(server)}")
    gate = Strategy(name="yieldgate").make_gate()
    async with open_raw(target, gate, Workload(), "openai") as send:
        await send("hello", Request(index=0, arrival_s=0.0))
    stats = gate.statistics()
    assert (stats.attempts, stats.yields) == (3, 2)


async def test_a_naive_429_carries_the_hint(scripted: Callable[..., object]) -> None:
    server = await scripted(  # type: ignore[misc]
        [reply("429 Too Many Requests", b'{"error": {"message": "x"}}', "Retry-After: 1.5\r\n")]
    )
    target = Target.parse(f"raw+http://127.0.0.1:{port_of(server)}")
    gate = Strategy(name="naive").make_gate()
    async with open_raw(target, gate, Workload(), "openai") as send:
        with pytest.raises(yieldgate.YieldExhaustedError) as caught:
            await send("hello", Request(index=0, arrival_s=0.0))
    assert retry_signal(caught.value) == (True, 1.5)
    assert error_kind(caught.value) == "YieldExhaustedError"


async def test_a_400_is_fatal(scripted: Callable[..., object]) -> None:
    server = await scripted(  # type: ignore[misc]
        [reply("400 Bad Request", b'{"error": {"message": "bad"}}')]
    )
    target = Target.parse(f"raw+http://127.0.0.1:{port_of(server)}")
    gate = Strategy(name="yieldgate").make_gate()
    async with open_raw(target, gate, Workload(), "openai") as send:
        with pytest.raises(yieldgate.CallFailedError):
            await send("hello", Request(index=0, arrival_s=0.0))
    assert gate.statistics().attempts == 1


def sse(_: bytes) -> bytes:
    events = [
        {"choices": [{"delta": {"role": "assistant"}}]},
        {"choices": [{"delta": {"content": "a"}}]},
        {"choices": [{"delta": {"content": "b"}}]},
    ]
    text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    raw = text.encode()
    # Cut the events across chunks at awkward places.
    pieces = [raw[:7], raw[7:60], raw[60:]]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    )


async def test_streaming_counts_content_events_and_reuses_the_connection(
    scripted: Callable[..., object],
) -> None:
    server = await scripted([sse])  # type: ignore[misc]
    target = Target.parse(f"raw+http://127.0.0.1:{port_of(server)}")
    gate = Strategy(name="yieldgate").make_gate()
    async with open_raw(target, gate, Workload(stream=True, max_tokens=4), "openai") as send:
        for i in range(3):
            request = Request(index=i, arrival_s=0.0)
            await send("hello", request)
            assert len(request.chunk_s) == 2
    assert server.connections == 1  # type: ignore[attr-defined]
    body = json.loads(server.bodies[0])  # type: ignore[attr-defined]
    assert (body["stream"], body["max_tokens"]) == (True, 4)
    assert gate.statistics().window.inflight == 0  # every lease released


@pytest.mark.e2e
def test_a_burst_through_the_cli(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "yieldgate",
            "burst",
            "--target",
            "raw+http://",
            "--serve",
            "--max-inflight 4 --exec-ms 5",
            "--requests",
            "40",
            "--concurrency",
            "8",
            "--strategy",
            "yieldgate,naive",
            "--compare",
            "--no-progress",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document = json.loads(out.read_text())
    assert document["config"]["target"] == "raw+http://"
    governed, naive = document["results"]
    assert governed["succeeded"] == 40
    assert governed["yields"] > 0  # 8 outstanding against 4 slots: refused, waited out
    assert naive["succeeded"] + naive["failed"] == 40
    assert naive["attempts"] == 40
    assert naive["failed"] > 0

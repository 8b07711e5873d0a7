"""The HTTP fronts in a real ``yieldgate serve --port 0 --http-port 0`` process."""

from __future__ import annotations

import contextlib
import json
import select
import signal
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest

from tests.conftest import RawClient, send_line, stats_when, submit
from yieldgate.server import ServerProcess

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]


async def wait_for(
    http: httpx.AsyncClient, predicate: Any, timeout: float = 15.0
) -> dict[str, Any]:
    """Poll ``GET /stats`` until ``predicate(stats)`` holds."""

    async def read() -> dict[str, Any]:
        stats: dict[str, Any] = (await http.get("/stats")).json()
        return stats

    return await stats_when(read, predicate, timeout)


async def test_tcp_and_http_clients_share_the_slots(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--max-inflight", "1", "--http-port", "0", "--exec-ms", "5")
    assert server.http_url is not None
    tcp: RawClient = await connect(server)
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        await tcp.send(submit("hold", params={"exec_ms": 30_000}))
        await wait_for(http, lambda s: s["inflight"] == 1)
        yielded = await http.post("/v1/completions", json={"model": "m", "prompt": "x"})
        assert yielded.status_code == 429
        assert yielded.json()["reason"] == "saturated"
        assert int(yielded.headers["retry-after-ms"]) > 0
        await tcp.aclose()  # the TCP client leaves: its slot frees
        await wait_for(http, lambda s: s["inflight"] == 0)

        other: RawClient = await connect(server)
        async with anyio.create_task_group() as tg:
            body = {"inputs": "x", "parameters": {"backend_params": {"exec_ms": 30_000}}}
            tg.start_soon(lambda: http.post("/generate", json=body))
            await wait_for(http, lambda s: s["inflight"] == 1)
            reply = await other.submit("from tcp")
            assert (reply["status"], reply["inflight"], reply["max_inflight"]) == ("yield", 1, 1)
            tg.cancel_scope.cancel()  # the HTTP client leaves
        stats = await wait_for(http, lambda s: s["inflight"] == 0)
    assert (stats["yielded_total"], stats["cancelled_total"], stats["inflight_peak"]) == (2, 2, 1)
    # The TCP stats op reports the HTTP front's counters too.
    assert (await other.stats())["http_requests_total"] >= 4


async def test_sigterm_lets_http_work_finish_and_refuses_new(serve: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "400", "--grace-s", "10")
    assert server.http_url is not None
    replies: list[httpx.Response] = []
    async with (
        httpx.AsyncClient(base_url=server.http_url) as working,
        httpx.AsyncClient(base_url=server.http_url) as late,
    ):
        assert (await late.get("/health")).status_code == 200  # keeps a connection open

        async def admitted() -> None:
            replies.append(await working.post("/generate", json={"inputs": "in flight"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(admitted)
            await wait_for(late, lambda s: s["inflight"] == 1)
            server.send_signal(signal.SIGTERM)
            await wait_for(late, lambda s: s["shutting_down"])
            refused = await late.post("/generate", json={"inputs": "too late"})
            assert refused.status_code == 503
            assert refused.json()["code"] == "shutting_down"
            health = await late.get("/health")
            assert (health.status_code, health.json()) == (503, {"status": "shutting_down"})
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=server.http_url) as fresh:
                await fresh.get("/health")  # no longer accepting
    assert replies[0].status_code == 200
    assert replies[0].json() == {"generated_text": "in flight"}
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_past_grace_http_work_is_answered_and_the_process_exits(serve: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "60000", "--grace-s", "0.3")
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        replies: list[httpx.Response] = []

        async def forever() -> None:
            replies.append(await http.post("/v1/completions", json={"model": "m", "prompt": "x"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(forever)
            await wait_for(http, lambda s: s["inflight"] == 1)
            server.send_signal(signal.SIGTERM)
    assert replies[0].status_code == 503
    assert replies[0].json()["error"]["code"] == "shutting_down"
    assert await anyio.to_thread.run_sync(server.wait) == 0


async def test_the_secret_guards_every_http_route_but_health(serve: Any, tmp_path: Path) -> None:
    # Issue 16 item 15: with --secret-file, unauthenticated inference and /stats got 200.
    secret = tmp_path / "secret"
    secret.write_text("correct horse\n")
    server: ServerProcess = serve(
        "--http-port", "0", "--secret-file", str(secret), "--exec-ms", "1"
    )
    assert server.http_url is not None
    requests: list[tuple[str, str, dict[str, Any] | None]] = [
        (
            "POST",
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
        ),
        ("POST", "/v1/completions", {"model": "m", "prompt": "x"}),
        ("GET", "/v1/models", None),
        ("POST", "/models/org/m", {"inputs": "x"}),
        ("POST", "/generate", {"inputs": "x"}),
        ("POST", "/generate_stream", {"inputs": "x"}),
        ("POST", "/", {"inputs": "x"}),
        ("GET", "/stats", None),
        ("GET", "/metrics", None),
        ("GET", "/v1/no-such-route", None),
        ("GET", "/generate", None),  # a route, the wrong method
    ]
    refused = 0
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "correct horse"}):
            for method, path, body in requests:
                response = await http.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (method, path, headers)
                assert response.headers["x-should-retry"] == "false"
                reply = response.json()
                if path.startswith("/v1/"):
                    assert reply["error"]["code"] == "unauthorized"
                    assert reply["error"]["type"] == "invalid_request_error"
                elif path in ("/generate", "/generate_stream", "/"):
                    assert (reply["code"], reply["error_type"]) == ("unauthorized", "unauthorized")
                    assert isinstance(reply["error"], str)
                else:  # the HuggingFace Inference API's shape (issue 41)
                    assert (reply["code"], "error_type" in reply) == ("unauthorized", False)
                    assert isinstance(reply["error"], str)
                refused += 1
        assert (await http.get("/health")).status_code == 200  # probes carry no secret
        authorized = {"Authorization": "Bearer correct horse"}
        for method, path, body in requests[:-2]:
            response = await http.request(method, path, json=body, headers=authorized)
            assert response.status_code == 200, (method, path, response.text)
        stats = (await http.get("/stats", headers=authorized)).json()
    assert stats["errors_by_code"] == {"unauthorized": refused}
    # The official client sends its api_key as the bearer token.
    async with openai.AsyncOpenAI(
        base_url=server.http_url + "/v1", api_key="correct horse", max_retries=0
    ) as client:
        chat = await client.completions.create(model="m", prompt="hello")
        assert chat.choices[0].text == "hello"
    async with openai.AsyncOpenAI(
        base_url=server.http_url + "/v1", api_key="wrong", max_retries=0
    ) as client:
        with pytest.raises(openai.AuthenticationError):
            await client.completions.create(model="m", prompt="hello")


def test_silent_http_connections_cannot_starve_either_front(serve: Any) -> None:
    # Issue 16 item 14: with 1,024 descriptors, 1,100 silent HTTP connections blocked
    # both fronts for good. Here: 64 descriptors and 150 silent connections.
    args = ["--exec-ms", "1", "--http-port", "0", "--http-head-timeout-s", "0.5"]
    server: ServerProcess = serve(*args, fd_limit=64)
    assert server.http_address is not None
    tcp_port = server.port
    http_port = server.http_address[1]
    silent: list[socket.socket] = []
    try:
        # Connections opened before the flood are served throughout.
        tcp = socket.create_connection(("127.0.0.1", tcp_port), timeout=10)
        http = socket.create_connection(("127.0.0.1", http_port), timeout=10)
        silent += [tcp, http]
        assert b'"pong"' in send_line(tcp, b'{"op":"ping","id":"before"}\n')
        assert http_get(http, "/health").startswith(b"HTTP/1.1 200 ")
        for _ in range(150):  # more than the server has descriptors for
            silent.append(socket.create_connection(("127.0.0.1", http_port), timeout=10))
        assert b'"pong"' in send_line(tcp, b'{"op":"ping","id":"during"}\n')
        # The server closes every silent connection (accepting the waiting ones as
        # descriptors free up), and both fronts take new connections again.
        for sock in silent[2:]:
            sock.settimeout(30)
            assert sock.recv(1) == b""
        with socket.create_connection(("127.0.0.1", tcp_port), timeout=10) as fresh:
            stats = json.loads(send_line(fresh, b'{"op":"stats","id":"after"}\n'))
        with socket.create_connection(("127.0.0.1", http_port), timeout=10) as fresh:
            assert http_get(fresh, "/health").startswith(b"HTTP/1.1 200 ")
        assert server.poll() is None, "the server died"
    finally:
        for sock in silent:
            sock.close()
    # The silent ones, and the one kept open, idle since its response.
    assert stats["http_connections_head_timeout_total"] == 151
    assert stats["connections_open"] == 2  # the first TCP connection and the asking one


def http_get(sock: socket.socket, path: str) -> bytes:
    """One keep-alive GET; its response head and the start of its body."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
    return sock.recv(65536)


def closed_by_server(sock: socket.socket) -> bytes:
    """What the server sends until it closes ``sock`` (a reset counts as closed)."""
    sock.settimeout(30)
    received = bytearray()
    try:
        while data := sock.recv(65536):
            received += data
    except ConnectionResetError:
        pass
    return bytes(received)


def http_stats(port: int) -> dict[str, Any]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /stats HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        reply = closed_by_server(sock)
    stats: dict[str, Any] = json.loads(reply.partition(b"\r\n\r\n")[2])
    return stats


# The guards on the fast parser, in the process `yieldgate serve` runs (issue 18 item 8).
HTTPTOOLS = ["--exec-ms", "1", "--http-port", "0", "--http-parser", "httptools"]


def test_httptools_closes_a_slow_loris_head_after_the_head_timeout(serve: Any) -> None:
    server: ServerProcess = serve(*HTTPTOOLS, "--http-head-timeout-s", "0.5")
    assert server.http_address is not None
    port = server.http_address[1]
    head = b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: " + b"a" * 200 + b"\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sent = 0
        for byte in head:  # a byte every 50 ms: the whole head would take 12 s
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += 1
            time.sleep(0.05)
            if select.select([sock], [], [], 0)[0]:
                break  # the server closed it (it sends nothing else)
        assert closed_by_server(sock) == b""
    assert sent < len(head)
    assert http_stats(port)["http_connections_head_timeout_total"] == 1


def test_httptools_refuses_connections_past_the_cap(serve: Any) -> None:
    server: ServerProcess = serve(*HTTPTOOLS, "--http-max-connections", "2")
    assert server.http_address is not None
    port = server.http_address[1]
    kept = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    try:
        for sock in kept:
            assert http_get(sock, "/health").startswith(b"HTTP/1.1 200 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            assert closed_by_server(extra) == b""
    finally:
        for sock in kept:
            sock.close()
    stats = http_stats(port)
    assert stats["http_connections_refused_total"] >= 1
    assert stats["http_connections_total"] >= 3  # the two kept and the one asking


def test_httptools_answers_408_to_a_body_that_stalls(serve: Any) -> None:
    server: ServerProcess = serve(*HTTPTOOLS, "--http-body-timeout-s", "0.3")
    assert server.http_address is not None
    port = server.http_address[1]
    head = (
        b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head + b'{"inputs": "x')
        reply = closed_by_server(sock)
    assert reply.startswith(b"HTTP/1.1 408 ")
    stats = http_stats(port)
    assert (stats["http_body_timeouts_total"], stats["admitted_total"]) == (1, 0)


def test_httptools_refuses_a_head_past_the_size_cap(serve: Any) -> None:
    server: ServerProcess = serve(*HTTPTOOLS)
    assert server.http_address is not None
    port = server.http_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        # Closed while sending, the reply may be lost.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (64 << 10))
        reply = closed_by_server(sock)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 431 ")
    assert http_stats(port)["http_connections_head_too_large_total"] == 1

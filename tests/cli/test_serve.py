"""``yieldgate serve`` as a user runs it: flags, errors, and the seed scenario end to end."""

from __future__ import annotations

import socket
import time
from typing import Any

import anyio
import httpx
import pytest

from tests.conftest import RawClient, run_cli, submit
from yieldgate.server import spawn

SEED_EXEC_MS = 4000


@pytest.mark.e2e
@pytest.mark.anyio
async def test_seed_scenario(serve: Any) -> None:
    """max_inflight 1, 20 concurrent clients, a long execution (PROTOCOL.md, seed 000)."""
    server = serve("--max-inflight", "1", "--exec-ms", str(SEED_EXEC_MS))
    clients = [await RawClient.connect(server) for _ in range(20)]
    monitor = await RawClient.connect(server)
    go = anyio.Event()
    replies: list[tuple[float, dict[str, Any]]] = []
    samples: list[dict[str, Any]] = []
    t0 = 0.0

    async def client(i: int, c: RawClient) -> None:
        await go.wait()
        reply = await c.request(submit(f"req-{i}", f"prompt {i}"), timeout=SEED_EXEC_MS / 1000 + 10)
        replies.append((time.monotonic() - t0, reply))

    async def sample(stop: anyio.Event) -> None:
        while not stop.is_set():
            samples.append(await monitor.stats())
            await anyio.sleep(0.02)

    try:
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample, stop)
            async with anyio.create_task_group() as fire:
                for i, c in enumerate(clients):
                    fire.start_soon(client, i, c)
                await anyio.sleep(0.1)
                t0 = time.monotonic()
                go.set()
            stop.set()
        final = await monitor.stats()
    finally:
        for c in [*clients, monitor]:
            await c.aclose()

    oks = [t for t, r in replies if r["status"] == "ok"]
    yields = [t for t, r in replies if r["status"] == "yield"]
    assert len(oks) == 1
    assert len(yields) == 19
    # The yields arrive at once, long before the execution ends.
    assert max(yields) < 1.0
    assert oks[0] >= SEED_EXEC_MS / 1000 * 0.95
    assert all(r["reason"] == "saturated" for _, r in replies if r["status"] == "yield")
    # inflight, sampled all along, never passed 1; it was 1 while the work ran.
    assert max(s["inflight"] for s in samples) == 1
    assert len(samples) > 20
    assert final["inflight_peak"] == 1
    assert (final["executed_total"], final["yielded_total"], final["inflight"]) == (1, 19, 0)


@pytest.mark.e2e
def test_listening_line_reports_the_real_port() -> None:
    with spawn() as server:
        assert server.host == "127.0.0.1"
        assert server.port > 0
        with socket.create_connection((server.host, server.port), timeout=5) as sock:
            sock.sendall(b'{"op":"ping","id":"1"}\n')
            assert sock.recv(4096) == b'{"id":"1","status":"ok","op":"pong"}\n'


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-inflight", "0"], "--max-inflight must be >= 1"),
        (["--max-inflight", "2", "--reserve-high", "2"], "--reserve-high and --reserve-normal"),
        (["--exec-mix", "fast"], "--exec-mix: bad entry"),
        (["--fail-rate", "2"], "--fail-rate must be in [0, 1]"),
        (["--port", "70000"], "--port must be in [0, 65535]"),
        (["--secret-file", "/nonexistent/secret"], "cannot read --secret-file"),
        (["--max-frame-bytes", "10"], "--max-frame-bytes"),
        (["--grace-s", "-1"], "--grace-s"),
        (["--grace-s", "nan"], "--grace-s"),
        (["--log-level", "bogus"], "--log-level"),
        (["--http-port", "70000"], "--http-port must be in"),
        (["--http-port", "0", "--max-body-bytes", "10"], "--max-body-bytes"),
        (["--http-port", "0", "--model-name", ""], "--model-name"),
        (["--write-timeout-s", "0"], "--write-timeout-s"),
        (["--http-port", "0", "--write-timeout-s", "inf"], "--write-timeout-s"),
        (["--http-port", "0", "--http-head-timeout-s", "-1"], "--http-head-timeout-s"),
        (["--http-port", "0", "--http-body-timeout-s", "nan"], "--http-body-timeout-s"),
        (["--http-port", "0", "--http-max-connections", "0"], "--http-max-connections"),
        (["--http-port", "0", "--http-parser", "picohttp"], "--http-parser"),
        (["--http-port", "0", "--quota-tpm", "0"], "--quota-tpm: must be a positive integer"),
        (["--http-port", "0", "--quota-rpm", "1.5"], "--quota-rpm: must be a positive integer"),
        (["--http-port", "0", "--quota-tpm", "9", "--quota-window-s", "0"], "--quota-window-s mu"),
        (["--quota-tpm", "100"], "add --http-port"),
        (["--http-port", "0", "--quota-itpm", "0"], "--quota-itpm: must be a positive integer"),
        (["--http-port", "0", "--quota-otpm", "x"], "--quota-otpm: must be a positive integer"),
        (["--quota-otpm", "100"], "add --http-port"),
        (["--http-port", "0", "--quota-window-s", "5"], "--quota-window-s needs"),
        (["--http-port", "0", "--quota-per-model"], "--quota-per-model needs"),
        (["--http-port", "0", "--quota-headers", "azure"], "--quota-headers needs"),
        (["--http-port", "0", "--quota-model", "gpt-4o"], "--quota-model wants MODEL=RPM:TPM"),
        (["--http-port", "0", "--quota-model", "m=1:x"], "must be whole numbers"),
        (["--http-port", "0", "--quota-model", "m=:"], "needs rpm, tpm or both"),
        (["--http-port", "0", "--quota-model", "m=0:5"], "positive integers or None"),
        (["--quota-model", "m=1:5"], "add --http-port"),
        (["--queue", "-1"], "--queue: must be a number of requests >= 0 or 'unbounded', got -1"),
        (["--queue", "lots"], "--queue: must be a number of requests >= 0 or 'unbounded'"),
        (["--queue", "2.5"], "--queue: must be a number of requests >= 0 or 'unbounded'"),
    ],
)
def test_bad_flags_are_one_clear_line_and_exit_2(args: list[str], message: str) -> None:
    result = run_cli("serve", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_empty_secret_file_is_refused(tmp_path: Any) -> None:
    empty = tmp_path / "secret"
    empty.write_text("\n")
    result = run_cli("serve", "--secret-file", str(empty))
    assert result.returncode == 2
    assert "is empty" in result.stderr


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--port", str(port))
    assert result.returncode == 1  # a failure of the machine's, not of the flags
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "in use" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.e2e
def test_warns_when_binding_beyond_loopback_without_a_secret() -> None:
    with spawn("--host", "0.0.0.0") as server:
        server.stop()
        assert "without --secret-file" in server.stderr


@pytest.mark.e2e
def test_listening_lines_for_both_fronts() -> None:
    with spawn("--http-port", "0", "--model-name", "tiny") as server:
        assert server.http_address is not None
        host, port = server.http_address
        assert host == "127.0.0.1"
        assert port > 0
        assert port != server.port
        assert server.http_url == f"http://127.0.0.1:{port}"
        models = httpx.get(server.http_url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "tiny"
    assert server.wait() == 0


def test_http_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--port", "0", "--http-port", str(port))
    assert result.returncode == 1
    assert f"cannot listen on HTTP 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.e2e
def test_warns_when_http_binds_beyond_loopback_without_a_secret() -> None:
    with spawn("--http-port", "0", "--http-host", "0.0.0.0") as server:
        server.stop()
        warnings = [line for line in server.stderr.splitlines() if line.startswith("warning:")]
        # TCP still binds loopback, so it is not warned about.
        assert len(warnings) == 1
        assert "binding HTTP on 0.0.0.0 without --secret-file" in warnings[0]


@pytest.mark.e2e
def test_no_warning_when_a_secret_guards_both_fronts(tmp_path: Any) -> None:
    secret = tmp_path / "secret"
    secret.write_text("k")
    with spawn("--host", "0.0.0.0", "--http-port", "0", "--secret-file", str(secret)) as server:
        server.stop()
        assert "warning:" not in server.stderr


def test_help_lists_the_commands() -> None:
    result = run_cli("--help")
    assert result.returncode == 0
    assert "serve" in result.stdout
    assert "demo" in result.stdout

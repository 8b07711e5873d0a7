"""Benchmark: the HTTP front's yield path against a bare ASGI app, with each parser.

A saturated ``yieldgate serve --max-inflight 1 --http-port 0`` (its one slot
held by a TCP submit that runs for an hour) answers every ``POST /generate``
with a 429 and its retry hints. Against it, a bare starlette app on the same
uvicorn, same loop (uvloop when installed) and same parser, returning the
same 429 (its status, headers and body, taken from the front's reply): what
the front costs on top of uvicorn. Both with uvicorn's h11 parser (pure
Python) and with httptools (C).

Like with like: the bare app reads the whole body, as the front must (the
front also parses it, as JSON in its dialect, and asks its Governor: that
is the front's own work, measured); uvicorn runs it without its
proxy-headers middleware, as the front does, and behind uvicorn's own
listener (the front accepts and guards its connections itself: that is
measured too).

A load process keeps ``--connections`` keep-alive connections busy, one
request in flight on each, for ``--seconds`` after a second of warm-up, and
counts whole replies; on Linux it also reads the server process's CPU time
over the same window, for the server's CPU per reply. Each (parser, server)
pair is measured ``--rounds`` times, interleaved so that the rest of the
machine disturbs all alike; every round is shown, and the best counts (the
most replies/s, the least CPU per reply). Ratios are of numbers taken in
this run: the front over the bare app per parser (goal >= 0.9), and
httptools over h11.

The load process shares the machine with the server: on few cores, replies
per second are bounded by both (when the load process is the bottleneck,
front and bare app both reach its rate, and the CPU per reply still tells
their costs apart), and only the ratios compare across machines.

Run it (from the repository root)::

    .venv/bin/python bench/http_front.py
    .venv/bin/python bench/http_front.py --connections 200 --seconds 5 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import platform
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, cast

from _common import add_smoke_flag, smoke
from yieldgate.protocol import encode_frame, stats_frame, submit_frame
from yieldgate.server import ServerProcess, spawn

GOAL = 0.9
BODY = b'{"inputs": "x"}'
REQUEST = (
    b"POST /generate HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
    b"content-length: " + str(len(BODY)).encode() + b"\r\n\r\n" + BODY
)
# Set by uvicorn for each reply: not part of the app's answer.
SERVER_HEADERS = {"date", "server", "content-length"}


def parsers() -> list[str]:
    found = ["h11"]
    if importlib.util.find_spec("httptools") is not None:
        found.append("httptools")
    return found


# -- the load ------------------------------------------------------------------


class _Client(asyncio.Protocol):
    """One keep-alive connection: a request, its whole reply, the next request."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass
        self.transport.write(REQUEST)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            at = self.buf.find(b"content-length: ", 0, end)
            if at < 0:
                raise RuntimeError(f"a reply without content-length: {bytes(self.buf[:end])!r}")
            length = int(self.buf[at + 16 : self.buf.index(b"\r\n", at)])
            if len(self.buf) < end + 4 + length:
                return
            del self.buf[: end + 4 + length]
            self.counts[0] += 1
            assert self.transport is not None
            self.transport.write(REQUEST)

    def connection_lost(self, exc: Exception | None) -> None:
        self.counts[1] += 1


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user and system) process ``pid`` has used; ``None`` off Linux."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(port: int, pid: int, connections: int, seconds: float) -> tuple[float, float]:
    """Replies per second, and the server's CPU microseconds per reply (nan if unknown)."""
    loop = asyncio.get_running_loop()
    counts = [0, 0]  # replies, connections lost
    transports = []
    for _ in range(connections):
        transport, _ = await loop.create_connection(lambda: _Client(counts), "127.0.0.1", port)
        transports.append(transport)
    await asyncio.sleep(1.0)  # warm-up
    start, before, cpu_before = time.perf_counter(), counts[0], cpu_seconds(pid)
    await asyncio.sleep(seconds)
    replies = counts[0] - before
    rate = replies / (time.perf_counter() - start)
    cpu_after = cpu_seconds(pid)
    cpu_us = math.nan
    if cpu_before is not None and cpu_after is not None and replies:
        cpu_us = (cpu_after - cpu_before) / replies * 1e6
    for transport in transports:
        transport.abort()
    if not rate:
        raise RuntimeError("no reply: see the errors above")
    if counts[1]:
        raise RuntimeError(f"the server closed {counts[1]} connections")
    return rate, cpu_us


def run_load(port: int, pid: int, connections: int, seconds: float) -> tuple[float, float]:
    """Replies per second and the server's CPU µs per reply, from a fresh load
    process (its own interpreter and core)."""
    load = ["--load-port", str(port), "--load-pid", str(pid)]
    load += ["--connections", str(connections), "--seconds", str(seconds)]
    out = subprocess.run(
        [sys.executable, __file__, *load],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rate, cpu_us = out.split()
    return float(rate), float(cpu_us)


# -- the servers -----------------------------------------------------------------


@contextlib.contextmanager
def saturated_front(parser: str) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """A front whose one slot is held: its HTTP port, its process id and its 429 reply."""
    server: ServerProcess = spawn(
        "--port", "0", "--http-port", "0", "--max-inflight", "1", "--exec-ms", "3600000",
        "--http-parser", parser, ready_timeout=30.0,
    )  # fmt: skip
    try:
        with socket.create_connection((server.host, server.port), timeout=10) as hold:
            hold.sendall(encode_frame(submit_frame("hold", "x")))
            _wait_for_inflight(server)
            assert server.http_address is not None
            port = server.http_address[1]
            reply = _wait_for_429(port)
            yield port, server.pid, reply
    finally:
        server.stop(timeout=10.0)


def _wait_for_inflight(server: ServerProcess) -> None:
    """Wait until the held submit runs (else the first HTTP request would take the slot)."""
    with socket.create_connection((server.host, server.port), timeout=10) as sock:
        for _ in range(200):
            sock.sendall(encode_frame(stats_frame("s")))
            line = sock.makefile("rb").readline()
            if json.loads(line)["inflight"] == 1:
                return
            time.sleep(0.05)
    raise RuntimeError("the held submit never ran")


def _wait_for_429(port: int) -> dict[str, Any]:
    deadline = time.monotonic() + 10
    while True:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.sendall(REQUEST)
            raw = b""
            while b"\r\n\r\n" not in raw or not raw.endswith(b"}"):
                raw += sock.recv(65536)
        head, _, body = raw.partition(b"\r\n\r\n")
        status_line, *lines = head.decode().split("\r\n")
        if " 429 " in status_line:
            headers = [line.split(": ", 1) for line in lines]
            kept = [(k, v) for k, v in headers if k.lower() not in SERVER_HEADERS]
            return {"headers": kept, "body": body.decode()}
        if time.monotonic() > deadline:
            raise RuntimeError(f"the front did not yield: {status_line}")
        time.sleep(0.05)


@contextlib.contextmanager
def bare_app(parser: str, reply: dict[str, Any]) -> Iterator[tuple[int, int]]:
    """A bare starlette app on uvicorn answering ``reply`` with a 429: its port and process id."""
    proc = subprocess.Popen(
        [sys.executable, __file__, "--bare-parser", parser, "--bare-reply", json.dumps(reply)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline()), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def serve_bare(parser: str, reply: dict[str, Any]) -> None:
    """Serve the bare app until terminated; print its port once listening."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    body = reply["body"].encode()
    headers = {k: v for k, v in reply["headers"] if k.lower() != "content-type"}
    media_type = dict((k.lower(), v) for k, v in reply["headers"]).get("content-type")

    async def generate(request: Request) -> Response:
        await request.body()  # as the front reads it
        return Response(body, status_code=429, headers=headers, media_type=media_type)

    app = Starlette(routes=[Route("/generate", generate, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    loop = "uvloop" if importlib.util.find_spec("uvloop") is not None else "asyncio"
    config = uvicorn.Config(
        app, http=parser, loop=loop, lifespan="off", access_log=False, log_config=None,
        server_header=False, ws="none", proxy_headers=False,  # as the front's
    )  # fmt: skip
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(config).run(sockets=[sock])


# -- the report ----------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--load-port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--load-pid", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--bare-parser", help=argparse.SUPPRESS)
    ap.add_argument("--bare-reply", help=argparse.SUPPRESS)
    add_smoke_flag(ap)
    args = ap.parse_args(argv)
    if smoke(args) and args.load_port is None and args.bare_parser is None:
        args.connections, args.seconds, args.rounds = 20, 0.5, 1
    if args.load_port is not None:
        runner = asyncio.run
        with contextlib.suppress(ImportError):
            import uvloop

            runner = uvloop.run
        rate, cpu_us = runner(_load(args.load_port, args.load_pid, args.connections, args.seconds))
        print(rate, cpu_us)
        return 0
    if args.bare_parser is not None:
        serve_bare(args.bare_parser, json.loads(args.bare_reply))
        return 0

    command = "python bench/http_front.py " + " ".join(
        f"--{k} {getattr(args, k)}" for k in ("connections", "seconds", "rounds")
    )
    print(f"command: {command}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"{args.connections} keep-alive connections, one request in flight on each\n")
    rounds: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with contextlib.ExitStack() as stack:
        servers: dict[tuple[str, str], tuple[int, int]] = {}
        for parser in parsers():
            port, pid, reply = stack.enter_context(saturated_front(parser))
            servers[parser, "yieldgate front"] = port, pid
            servers[parser, "bare app"] = stack.enter_context(bare_app(parser, reply))
        for _ in range(args.rounds):
            for key, (port, pid) in servers.items():
                rounds.setdefault(key, []).append(
                    run_load(port, pid, args.connections, args.seconds)
                )
    best = {key: max(rate for rate, _ in results) for key, results in rounds.items()}
    cpu = {key: min(cpu_us for _, cpu_us in results) for key, results in rounds.items()}
    print(f"{'parser':<10} {'server':<16} {'replies/s':>10} {'CPU µs/reply':>13}  rounds")
    for (parser, server), results in rounds.items():
        each = ", ".join(f"{rate:,.0f} ({cpu_us:.0f} µs)" for rate, cpu_us in results)
        print(
            f"{parser:<10} {server:<16} {best[parser, server]:>10,.0f} "
            f"{cpu[parser, server]:>13.1f}  {each}"
        )
    print()
    for parser in parsers():
        ratio = best[parser, "yieldgate front"] / best[parser, "bare app"]
        verdict = "met" if ratio >= GOAL else "missed"
        print(f"front / bare app, {parser}: {ratio:.2f}x (goal >= {GOAL}: {verdict})")
        cost = cpu[parser, "yieldgate front"] / cpu[parser, "bare app"]
        print(f"front / bare app CPU per reply, {parser}: {cost:.2f}x")
    if "httptools" in parsers():
        for server in ("yieldgate front", "bare app"):
            ratio = best["httptools", server] / best["h11", server]
            print(f"httptools / h11, {server}: {ratio:.2f}x")
    else:
        print("httptools is not installed: h11 only")
    return 0


if __name__ == "__main__":
    sys.exit(main())

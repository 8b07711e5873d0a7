"""Fleets end to end: members as real processes, one real Redis, the reference server.

Each member (``tests/fleet/member.py``) is its own process with its own Gate
named alike and ``shared=`` the session's Redis; all start together and fire
their burst through ``AsyncOpenAI``. The bounds asserted are the server's
(its quota's refill time, its counters), not the machine's speed.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import http_stats
from tests.fleet.conftest import RedisServer
from tests.fleet.member import fairness, jobs, results, shares, start, status
from yieldgate.server import ServerProcess

pytestmark = pytest.mark.e2e

MEMBERS = 4
REQUESTS = 100
WINDOW_S = 12.0
# The users' shape: a per-minute quota, as providers meter it.
USERS_WINDOW_S = 60.0


def start_members(
    server: ServerProcess,
    redis_url: str | None,
    *extra: str,
    members: int = MEMBERS,
    name: str | None = None,
) -> list[subprocess.Popen[str]]:
    return start(server.http_url, redis_url, members, *extra, name=name)


def burst_cost(members: int = MEMBERS) -> int:
    return sum(
        math.ceil(len(f"user: {text}") / 4) + max_tokens
        for i in range(members)
        for text, max_tokens in jobs(REQUESTS, i)
    )


def quota_server(
    serve: Any, window_s: float = WINDOW_S, members: int = MEMBERS
) -> tuple[ServerProcess, int, float]:
    cost = burst_cost(members)
    tpm = math.ceil(cost / 1.5)
    server: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "256",
        "--quota-tpm", str(tpm), "--quota-rpm", "100000", "--quota-window-s", str(window_s),
    )  # fmt: skip
    return server, tpm, (cost - tpm) / (tpm / window_s)


def test_a_fleet_paces_one_quota_as_one(serve: Any, redis_server: RedisServer) -> None:
    server, _tpm, bound_s = quota_server(serve)
    runs = results(start_members(server, redis_server.url))
    assert [run["failed"] for run in runs] == [0] * MEMBERS, [run["errors"] for run in runs]
    counters = http_stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    assert counters["quota_requests_charged_total"] == MEMBERS * REQUESTS
    assert refused <= 0.02 * MEMBERS * REQUESTS, counters
    # From the fleet's first answer, as in the users' shape below: with both cores
    # kept busy by two other processes, the first answers came 1.7-2.1 s after the
    # go (0.5-1.3 s on idle cores), and the makespan from the go was 7.2-7.3 s
    # against a 7.2 s limit.
    first_answer = min(run["started_at"] + run["done"][0] for run in runs)
    makespan = max(run["ended_at"] for run in runs) - first_answer
    assert makespan <= 1.2 * bound_s, (makespan, bound_s)
    assert fairness(runs) >= 0.9, (shares(runs), [run["done"][:1] for run in runs])


def test_members_started_without_a_barrier_pace_from_their_first_call(
    serve: Any, redis_server: RedisServer
) -> None:
    """Members start as a deployment's processes do: each fires as soon as its imports
    are done (no heartbeat first, no barrier), some later than others. Before any
    answer, one member's first request probes the quota; the others wait for its
    reading instead of sending blind. The window is twice the other tests' (a 12 s
    bound): the members' staggered starts are no part of the quota's pacing."""
    server, _tpm, bound_s = quota_server(serve, 2 * WINDOW_S)
    name = f"fleet-nb-{uuid.uuid4().hex[:8]}"
    procs = []
    for i, delay_s in enumerate((0.0, 0.05, 0.3, 0.8)):
        extra = ("--requests", str(REQUESTS), "--seed", str(i), "--delay-s", str(delay_s))
        procs += start(server.http_url, redis_server.url, 1, *extra, barrier=False, name=name)
    runs = results(procs)
    assert [run["failed"] for run in runs] == [0] * MEMBERS, [run["errors"] for run in runs]
    counters = http_stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    assert counters["quota_requests_charged_total"] == MEMBERS * REQUESTS
    assert refused <= 0.02 * MEMBERS * REQUESTS, counters
    # From the first member's first call to the last member's last answer.
    makespan = max(run["ended_at"] for run in runs) - min(run["started_at"] for run in runs)
    assert makespan <= 1.2 * bound_s, (makespan, bound_s)


@pytest.mark.parametrize("members", [4, 16])
def test_a_fleet_in_the_users_shape_paces_from_its_first_second(
    serve: Any, redis_server: RedisServer, members: int
) -> None:
    """Issue 39: members as users start and drive them: processes that fire their
    whole burst as soon as their imports are done (no barrier, no heartbeat first),
    each through ``openai.AsyncOpenAI(http_client=yieldgate.http_client(gate))``
    with ``Gate(name=..., shared=url)`` and the default policy, against a per-minute
    token quota that the fleet's burst exceeds by half. On main, four such members
    got 102-116 429s in 400, all in the first second of the burst: their event loops,
    busy building 100 requests each, made Redis look slower than the fleet's 50 ms
    budget, so they went on alone, blind; and a probe whose ask timed out kept every
    member waiting out first_reading_s. The 429s' times are in the message.

    The makespan runs from the fleet's first answer to its last. Counted from the
    first member's start, it held what 16 processes need to start on 2 cores: on
    the idle dev VM the first answer came 2.3 s after that start and the last 32.5 s
    after (30 s from the first: the pacing itself is tight); with two CPU hogs the
    last came 34.9-36.1 s after, past the 15%."""
    server, _tpm, bound_s = quota_server(serve, USERS_WINDOW_S, members)
    procs = start(
        server.http_url, redis_server.url, members, "--users-shape",
        "--requests", str(REQUESTS), barrier=False,
    )  # fmt: skip
    runs = results(procs, timeout=300)
    began = min(run["started_at"] for run in runs)
    refused_at = sorted(round(t - began, 2) for run in runs for t in run["refused_at"])
    assert [run["failed"] for run in runs] == [0] * members, [run["errors"] for run in runs]
    counters = http_stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    assert counters["quota_requests_charged_total"] == members * REQUESTS
    # Per member: its 429s, and its outages (a member that went on alone).
    each = [(len(run["refused_at"]), run["outages"]) for run in runs]
    assert refused <= 0.02 * members * REQUESTS, (refused, "429s at (s)", refused_at, each)
    # From the fleet's first answer, about when its quota began to refill (the first
    # reading's probe, sent alone): before it, processes still starting.
    first_answer = min(run["started_at"] + run["done"][0] for run in runs)
    makespan = max(run["ended_at"] for run in runs) - first_answer
    assert makespan <= 1.15 * bound_s, (
        makespan, bound_s, "first answer at (s)", first_answer - began, "429s at (s)", refused_at
    )  # fmt: skip


def test_a_fleet_wide_cap_keeps_a_governed_server_from_yielding(
    serve: Any, redis_server: RedisServer
) -> None:
    server: ServerProcess = serve("--http-port", "0", "--exec-ms", "50", "--max-inflight", "8")
    unshared = results(start_members(server, None))
    alone = http_stats(server)["yielded_total"]
    server2: ServerProcess = serve("--http-port", "0", "--exec-ms", "50", "--max-inflight", "8")
    shared = results(start_members(server2, redis_server.url, "--cap", "8"))
    together = http_stats(server2)["yielded_total"]
    assert all(run["failed"] == 0 for run in unshared + shared)
    assert alone > 0
    assert together <= 0.1 * alone, (together, alone)
    assert http_stats(server2)["inflight_peak"] <= 8
    # Fair between members: with only "the cap, first come", about 0.9-0.97.
    assert fairness(shared) >= 0.98, (shares(shared), [run["done"][:1] for run in shared])


def test_redis_killed_mid_burst_fails_no_call_and_restarted_is_rejoined(
    serve: Any, fresh_redis: RedisServer, tmp_path: Path
) -> None:
    server, _tpm, _bound = quota_server(serve)
    procs = start(server.http_url, fresh_redis.url, MEMBERS, status_dir=tmp_path)
    try:
        # Each wait has a bound of its own: the members' start-up (four interpreters
        # importing openai on a busy machine) is no part of how soon they meet an outage.
        deadline = time.monotonic() + 120
        while http_stats(server)["quota_requests_charged_total"] < 50:  # under way
            assert time.monotonic() < deadline
            time.sleep(0.05)
        fresh_redis.stop()
        stopped = time.monotonic()
        # Down until every member has met the outage (a member whose calls all wait
        # out a pace, at most a window, meets it only when they wake) and half the
        # burst is charged.
        while (
            http_stats(server)["quota_requests_charged_total"] < 200
            or min(status(tmp_path / f"{i}.json")["outages"] for i in range(MEMBERS)) < 1
        ):
            waited = time.monotonic() - stopped
            assert waited < 60 + 2 * WINDOW_S, (
                waited,
                http_stats(server)["quota_requests_charged_total"],
                [status(tmp_path / f"{i}.json") for i in range(MEMBERS)],
            )
            time.sleep(0.05)
        fresh_redis.start()  # the same port
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise
    runs = results(procs)
    assert [run["failed"] for run in runs] == [0] * MEMBERS, [run["errors"] for run in runs]
    assert all(run["fleet"]["outages"] >= 1 for run in runs), [run["fleet"] for run in runs]
    # A member with calls left when Redis came back rejoined it (one that finished
    # on its local limits meanwhile had nothing to ask it).
    assert sum(run["fleet"]["rejoins"] for run in runs) >= 1, [run["fleet"] for run in runs]
    assert http_stats(server)["quota_requests_charged_total"] == MEMBERS * REQUESTS


def test_a_lease_is_renewed_while_held_and_lapses_when_its_member_dies(
    serve: Any, redis_server: RedisServer
) -> None:
    server: ServerProcess = serve("--http-port", "0", "--max-inflight", "8", "--exec-ms", "10")
    args = ("--requests", "1", "--cap", "1", "--lease-ttl-s", "3")
    name = "fleet-e2e-lease"  # one fleet: the holder and the waiter
    holder = start_members(
        server, redis_server.url, *args, "--exec-ms", "600000", members=1, name=name
    )
    deadline = time.monotonic() + 60
    while http_stats(server)["inflight"] < 1:  # its one call runs: it holds the one lease
        assert time.monotonic() < deadline
        time.sleep(0.05)
    waiter = start_members(server, redis_server.url, *args, members=1, name=name)
    # Two TTLs on, the holder's renewed lease still keeps the waiter out.
    time.sleep(6.0)
    assert waiter[0].poll() is None
    assert http_stats(server)["inflight_peak"] == 1
    holder[0].send_signal(signal.SIGKILL)
    holder[0].wait()
    (run,) = results(waiter, timeout=60)
    assert run["ok"] == 1  # the dead member's lease lapsed within its TTL
    assert http_stats(server)["inflight_peak"] == 1

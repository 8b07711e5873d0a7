"""One member of a fleet, as its own process: a burst of chat completions through one Gate.

Run by the fleet's end-to-end tests and bench/fleet.py (``python
tests/fleet/member.py ...``): it says ``ready`` once it has joined the fleet
(its first heartbeat), starts when its standard input says ``go`` (so that
every member starts together), fires ``--requests`` chat completions at once
through ``AsyncOpenAI`` on ``yieldgate.openai_client(Gate(name=--name,
shared=--redis))`` (or an unshared Gate without ``--redis``), and prints one
JSON line: how many succeeded, the errors, when each call completed (seconds
after the start) and the fleet link's statistics. With ``--no-barrier`` it
fires as soon as its imports are done (after ``--delay-s``), as processes a
deployment starts do.

``--users-shape`` is a member as users write one, nothing tuned for the test:
``Gate(name=..., shared=--redis)`` with the default policy (the fleet's 250 ms
budget per Redis operation, its 5 s first reading), ``openai.AsyncOpenAI(
http_client=yieldgate.http_client(gate))`` with openai's own defaults, no
barrier. It records when each attempt was refused (a 429), on the wall clock
(``refused_at``), so that a wave at the start cannot hide in a total.

Imported, it is also how the tests and the bench start members (``start``),
collect what they printed (``results``) and measure fairness between them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import yieldgate
from yieldgate import FleetPolicy, Gate, GatePolicy, RetryPolicy
from yieldgate.gate import (
    AttemptDetails,
    CallObserver,
    NullInstrumentation,
    OutcomeKind,
)

ROOT = Path(__file__).resolve().parents[2]


def start(
    server_url: str,
    redis_url: str | None,
    members: int,
    *extra: str,
    name: str | None = None,
    barrier: bool = True,
    status_dir: Path | None = None,
) -> list[subprocess.Popen[str]]:
    """Start ``members`` members (``--seed`` 0, 1, ...), and once every one has said it
    is ready, tell them all to go. Without ``barrier``, each fires as soon as its
    imports are done, as processes a deployment starts do (no heartbeat first).

    Their Gate is named ``name``, by default a new name for each fleet started:
    what an earlier fleet left in Redis under its name (the quota it learnt, kept
    for a minute or more) is not this one's. With ``status_dir``, member ``i`` keeps
    what its fleet link has seen so far in ``status_dir / f"{i}.json"`` (``status``).
    """
    name = name or f"fleet-e2e-{uuid.uuid4().hex[:8]}"
    env = member_env()
    procs = []
    for i in range(members):
        args = [sys.executable, __file__, "--server", server_url, "--seed", str(i), *extra]
        args += ["--name", name]
        if not barrier:
            args.append("--no-barrier")
        if status_dir is not None:
            args += ["--status-file", str(status_dir / f"{i}.json")]
        if redis_url is not None:
            args += ["--redis", redis_url]
        procs.append(
            subprocess.Popen(
                args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
            )
        )
    if barrier:
        release(procs)
    return procs


def member_env() -> dict[str, str]:
    """The environment of a member process: the tree under test first (a worktree's,
    not the editable install's), then the tests."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "src"), str(ROOT)))}


def release(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Once every member has said ``ready``, tell them all to go; if one never does,
    every member is killed before the error goes on."""
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
    except BaseException:
        for proc in procs:
            proc.kill()
            proc.wait()
        raise


def results(procs: Sequence[subprocess.Popen[str]], timeout: float = 240.0) -> list[dict[str, Any]]:
    """What each member printed, once all are done; any left running are killed."""
    out = []
    try:
        for proc in procs:
            stdout, _ = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, stdout
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return out


def jain(counts: Sequence[float]) -> float:
    """Jain's fairness index of ``counts`` (1: all equal)."""
    total = sum(counts)
    return total * total / (len(counts) * sum(c * c for c in counts)) if total else 1.0


def fairness(runs: Sequence[dict[str, Any]]) -> float:
    """The least Jain's index of the members' requests completed in the first quarter,
    half and three quarters of the time all of them were sending: from the first
    completion of the member that completed a call last.

    Members are told to go together, but their first call costs each some CPU
    (the client's first request) and on a busy machine one gets through it a few
    hundred milliseconds before the others: it rightly has the whole fleet to
    itself until they ask (an idle member holds nothing back), and what it
    completed before then says nothing about how the fleet shares. On a machine
    busy enough, it completes nearly its whole burst in that time (the quota's
    first bucket holds more than one member's burst), and has little left to ask
    for: each index is taken over the members that still had calls to complete
    after its span (a member favoured over the others shows in the spans before
    its burst ran out).
    """
    counts = shares(runs)
    return min(jain(c) for c in counts) if counts else 0.0


def shares(runs: Sequence[dict[str, Any]]) -> list[list[int]]:
    """What ``fairness`` rates: per quarter, half and three quarters of the shared time,
    the requests completed in it by each member that still had calls to complete after
    it (``[]`` when a member completed none); a failed fairness check prints them, with
    each member's first completion."""
    if not all(run["done"] for run in runs):
        return []
    begin = max(run["done"][0] for run in runs)
    end = max(run["makespan"] for run in runs)
    counts = []
    for q in (0.25, 0.5, 0.75):
        until = begin + (end - begin) * q
        wanting = [run for run in runs if run["done"][-1] > until]
        counts.append([sum(1 for t in run["done"] if begin < t <= until) for run in wanting])
    return counts


def jobs(requests: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [("x" * rng.choice((20, 200, 800)), rng.choice((16, 64, 128))) for _ in range(requests)]


async def fire(calls: Sequence[Callable[[], Awaitable[Any]]]) -> dict[str, Any]:
    """Make every call at once: how many succeeded, the first errors, when each success
    came (seconds after the start), the makespan, and the wall clock at the start and
    the end (to compare members started apart). An error is reported, not raised."""
    done: list[float] = []
    errors: list[str] = []
    start = time.monotonic()
    started_at = time.time()

    async def one(call: Callable[[], Awaitable[Any]]) -> None:
        try:
            await call()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}"[:300])
        else:
            done.append(time.monotonic() - start)

    await asyncio.gather(*(one(call) for call in calls))
    return {
        "ok": len(done),
        "errors": errors[:5],
        "failed": len(errors),
        "done": sorted(done),
        "makespan": time.monotonic() - start,
        "started_at": started_at,
        "ended_at": time.time(),
    }


class Refusals(NullInstrumentation):
    """When each attempt was refused (wall clock): the Gate's own telemetry hook."""

    def __init__(self) -> None:
        self.at: list[float] = []

    def start_call(self, gate: str, priority: Any) -> CallObserver:
        return _Refused(self.at)


class _Refused:
    def __init__(self, at: list[float]) -> None:
        self._at = at

    def scope(self) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def on_attempt(self, details: AttemptDetails) -> None:
        if details.outcome is OutcomeKind.YIELD:
            self._at.append(time.time())

    def on_wait(self, details: Any) -> None:
        pass

    def on_end(self, details: Any) -> None:
        pass


async def users_shape(args: argparse.Namespace) -> dict[str, Any]:
    """One member as users write it (see the module docstring)."""
    import openai

    refusals = Refusals()
    gate = Gate(name=args.name, shared=args.redis, instrumentation=refusals)
    client = openai.AsyncOpenAI(
        base_url=f"{args.server}/v1", api_key="unused", http_client=yieldgate.http_client(gate)
    )

    def one(text: str, max_tokens: int) -> Callable[[], Awaitable[Any]]:
        return lambda: client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": text}], max_tokens=max_tokens
        )

    report = await fire([one(*job) for job in jobs(args.requests, args.seed)])
    stats = gate.statistics()
    link = gate._core.shared
    outages = None if link is None else link.fleet.statistics().outages
    await client.close()
    await gate.aclose()
    return {**report, "attempts": stats.attempts, "refused_at": refusals.at, "outages": outages}


async def write_status(path: str, links: Sequence[Any]) -> None:
    """Keep ``path`` holding the fleet links' outages and rejoins so far (a JSON
    object, replaced whole), for a test to wait on what every member has seen."""
    last = None
    while True:
        stats = [link.fleet.statistics() for link in links if link is not None]
        now = {
            "outages": sum(st.outages for st in stats),
            "rejoins": sum(st.rejoins for st in stats),
        }
        if now != last:
            _replace(path, json.dumps(now))  # a few bytes: no thread needed
            last = now
        await asyncio.sleep(0.02)


def _replace(path: str, text: str) -> None:
    with open(f"{path}.tmp", "w") as out:
        out.write(text)
    os.replace(f"{path}.tmp", path)


def status(path: Path) -> dict[str, int]:
    """What a member's ``--status-file`` says (nothing seen yet before it exists)."""
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        return {"outages": 0, "rejoins": 0}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.delay_s:
        await asyncio.sleep(args.delay_s)
    if args.users_shape:
        return await users_shape(args)
    policy = GatePolicy(
        retry=RetryPolicy(max_yields=10_000),
        fleet=FleetPolicy(
            inflight_cap=args.cap,
            lease_ttl_s=args.lease_ttl_s,
            budget_s=args.budget_s,
            first_reading_s=args.first_reading_s,
        ),
    )
    # Each Gate is a member of its own (its own fleet link, its own member id).
    gates = [Gate(policy, name=args.name, shared=args.redis) for _ in range(args.gates)]
    clients = [
        yieldgate.openai_client(gate, base_url=f"{args.server}/v1", api_key="unused")
        for gate in gates
    ]
    links = [gate._core.shared for gate in gates]
    if args.barrier:
        for gate, link in zip(gates, links, strict=True):
            if link is not None:  # a member from the start: its share is right
                await link.fleet.heartbeat(gate.name)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)  # "go"
    extra_body = None if args.exec_ms is None else {"backend_params": {"exec_ms": args.exec_ms}}

    def one(client: Any, text: str, max_tokens: int) -> Callable[[], Awaitable[Any]]:
        return lambda: client.chat.completions.create(
            model="gpt-4o",
            messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens,
            extra_body=extra_body,
        )

    watch = asyncio.create_task(write_status(args.status_file, links)) if args.status_file else None
    try:
        report = await fire(
            [
                one(client, *job)
                for g, client in enumerate(clients)
                for job in jobs(args.requests, args.seed * args.gates + g)
            ]
        )
    finally:
        if watch is not None:
            watch.cancel()
    stats = [link.fleet.statistics() for link in links if link is not None]
    attempts = sum(gate.statistics().attempts for gate in gates)
    waited_s = sum(gate.statistics().waited_s for gate in gates)
    for client, gate in zip(clients, gates, strict=True):
        await client.close()
        await gate.aclose()
    return {
        **report,
        "attempts": attempts,
        "waited_s": waited_s,
        "fleet": None if not stats else {
            "fallbacks": sum(st.fallbacks for st in stats),
            "outages": sum(st.outages for st in stats),
            "rejoins": sum(st.rejoins for st in stats),
            "calls": sum(st.calls for st in stats),
        },
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--redis")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="fleet-e2e")
    parser.add_argument("--cap", type=int)
    parser.add_argument("--lease-ttl-s", type=float, default=60.0)
    parser.add_argument("--exec-ms", type=float)
    # Generous by default: the tests must pass on a machine whose cores are all busy.
    parser.add_argument("--budget-s", type=float, default=1.0)
    parser.add_argument("--no-barrier", dest="barrier", action="store_false")
    # Without a barrier: wait this long first (imports that take their time).
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--first-reading-s", type=float, default=5.0)
    # Gates in this process, each a member with its own id (--requests each, seeds
    # --seed * --gates + 0, 1, ...).
    parser.add_argument("--gates", type=int, default=1)
    parser.add_argument("--users-shape", action="store_true")
    # Keep the fleet links' outages and rejoins so far in this file (see write_status).
    parser.add_argument("--status-file")
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
    sys.exit(0)

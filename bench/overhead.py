"""Benchmark: what the Gate costs per call on the happy path, against tenacity alone.

For async code, ways to await the same no-op coroutine, timed in one run on
one event loop:

- ``bare``: ``await noop()``;
- ``tenacity``: a reused ``tenacity.AsyncRetrying`` (stop after 3 attempts,
  exponential jitter), the retry library most code uses today;
- ``gate``: ``Gate.call(noop)`` with the default policy and the default
  instrumentation (OpenTelemetry API with no SDK installed: no-op spans and
  instruments, as in an application that has not configured telemetry);
- ``gate, no telemetry``: the same with ``NullInstrumentation``.

For sync code, the same with a plain no-op function: ``bare``, a reused
``tenacity.Retrying`` with the same strategies, ``Gate.call_sync`` (the sync
driver) with and without telemetry.

Each is measured for ``--calls`` calls, ``--rounds`` times; the best round
counts (the least disturbed by the rest of the machine). Overhead is the time
per call above ``bare``. The figures that matter are the Gate's overheads over
tenacity's (goals: async <= 0.75, sync <= 1.0): the Gate does strictly more per call (a deadline,
a breaker ticket, a window permit, classification, telemetry) yet its first
attempt runs inline, and only a call that must retry enters tenacity.

Run it (from the repository root)::

    .venv/bin/python bench/overhead.py
    .venv/bin/python bench/overhead.py --calls 200000 --rounds 5
    .venv/bin/python bench/overhead.py --smoke   # seconds: does it still run?
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Awaitable, Callable, Sequence

import anyio
from tenacity import AsyncRetrying, Retrying, stop_after_attempt

from _common import add_smoke_flag, exponential_jitter, smoke
from yieldgate import Gate
from yieldgate.gate import NullInstrumentation

ASYNC_GOAL = 0.75
SYNC_GOAL = 1.0


async def noop() -> int:
    return 1


def sync_noop() -> int:
    return 1


async def time_calls(call: Callable[[], Awaitable[object]], calls: int) -> float:
    """Seconds per call of ``call``, over ``calls`` sequential calls."""
    start = time.perf_counter()
    for _ in range(calls):
        await call()
    return (time.perf_counter() - start) / calls


async def measure(calls: int, rounds: int) -> dict[str, float]:
    retrying = AsyncRetrying(stop=stop_after_attempt(3), wait=exponential_jitter(0.1, 5))
    gate = Gate(name="bench")
    quiet = Gate(name="bench-quiet", instrumentation=NullInstrumentation())
    contenders: dict[str, Callable[[], Awaitable[object]]] = {
        "bare": noop,
        "tenacity": lambda: retrying(noop),
        "gate": lambda: gate.call(noop),
        "gate, no telemetry": lambda: quiet.call(noop),
    }
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, call in contenders.items():
            await time_calls(call, calls // 10)  # warm-up
            best[name] = min(best[name], await time_calls(call, calls))
    return best


def time_sync_calls(call: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


def measure_sync(calls: int, rounds: int) -> dict[str, float]:
    retrying = Retrying(stop=stop_after_attempt(3), wait=exponential_jitter(0.1, 5))
    gate = Gate(name="bench-sync")
    quiet = Gate(name="bench-sync-quiet", instrumentation=NullInstrumentation())
    contenders: dict[str, Callable[[], object]] = {
        "bare": sync_noop,
        "tenacity": lambda: retrying(sync_noop),
        "gate": lambda: gate.call_sync(sync_noop),
        "gate, no telemetry": lambda: quiet.call_sync(sync_noop),
    }
    best = {name: float("inf") for name in contenders}
    for _ in range(rounds):
        for name, call in contenders.items():
            time_sync_calls(call, calls // 10)  # warm-up
            best[name] = min(best[name], time_sync_calls(call, calls))
    return best


def report(title: str, best: dict[str, float], goal: float) -> None:
    bare = best["bare"]
    print(title)
    print(f"{'contender':<20} {'us/call':>8} {'overhead us':>12}")
    for name, per_call in best.items():
        print(f"{name:<20} {per_call * 1e6:>8.2f} {(per_call - bare) * 1e6:>12.2f}")
    tenacity_overhead = best["tenacity"] - bare
    for name in ("gate", "gate, no telemetry"):
        ratio = (best[name] - bare) / tenacity_overhead
        print(f"ratio {name} / tenacity (overhead): {ratio:.2f} (goal <= {goal:g})")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=100_000, help="calls per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the best one counts")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.calls, args.rounds = 2_000, 1

    best = anyio.run(measure, args.calls, args.rounds)
    print(
        f"{args.calls:,} calls x {args.rounds} rounds (best round), {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}"
    )
    report("async: AsyncRetrying against Gate.call", best, ASYNC_GOAL)
    report(
        "sync: Retrying against Gate.call_sync", measure_sync(args.calls, args.rounds), SYNC_GOAL
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

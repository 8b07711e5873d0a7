"""Hedging: p50/p99 latency and attempts per request, hedged against unhedged, in one run.

Two scenarios, each run unhedged and hedged against the same fresh servers:

- ``tail``: one governed server whose executions take 20 ms nine times in
  ten and ``--tail-ms`` (default 1000 ms) otherwise: the long tail of a
  replica that sometimes lands a request in a long batch. The hedged Gate
  uses the observed p95 of recent latencies as its delay, up to two hedges.
- ``slow+fast``: two servers as one upstream set, one drawing 20 ms or
  1500 ms at even odds, the other always 20 ms. The hedged Gate hedges after
  a fixed 100 ms, to the other upstream.

Each mode fires ``--calls`` submits with ``--concurrency`` callers through
``GovernedClient``; the table gives p50, p99 and max latency, attempts per
request, hedges, and what the slow server cancelled (the losers, cancelled
on the server when their connection closed). The ratio line divides hedged
by unhedged in the same run. Servers come from the burst tool's launcher.

    .venv/bin/python bench/hedging.py [--calls 400] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import random
import shlex
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import anyio

from _common import add_smoke_flag, smoke
from yieldgate import Gate, GatePolicy, GovernedClient, HedgePolicy
from yieldgate.burst import Percentiles
from yieldgate.gate import NullInstrumentation
from yieldgate.server import spawn


@dataclass(frozen=True, slots=True)
class Result:
    scenario: str
    mode: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    attempts_per_request: float
    hedges: int
    cancelled_on_server: int
    failed: int


async def run_mode(
    scenario: str, mode: str, urls: list[str], hedge: HedgePolicy | None, args: argparse.Namespace
) -> Result:
    gate = Gate(
        GatePolicy(hedge=hedge),
        name=f"{scenario}-{mode}",
        upstreams={u: u for u in urls} if len(urls) > 1 else None,
        instrumentation=NullInstrumentation(),
        rng=random.Random(args.seed),
    )
    latencies: list[float] = []
    failed = 0
    async with GovernedClient(urls, gate=gate) as client:
        before = [await stats_of(u) for u in urls]
        limiter = anyio.Semaphore(args.concurrency)

        async def one(i: int) -> None:
            nonlocal failed
            async with limiter:
                start = anyio.current_time()
                try:
                    await client.submit(f"request {i}")
                except Exception:
                    failed += 1
                    return
                latencies.append(anyio.current_time() - start)

        async with anyio.create_task_group() as tg:
            for i in range(args.calls):
                tg.start_soon(one, i)
        after = [await stats_of(u) for u in urls]
    stats = gate.statistics()
    spread = Percentiles.of(latencies, scale=1000)
    assert spread.p50 is not None
    assert spread.p99 is not None
    pairs = zip(after, before, strict=True)
    cancelled = sum(a["cancelled_total"] - b["cancelled_total"] for a, b in pairs)
    return Result(
        scenario=scenario,
        mode=mode,
        p50_ms=spread.p50,
        p99_ms=spread.p99,
        max_ms=1000 * max(latencies),
        attempts_per_request=stats.attempts / args.calls,
        hedges=stats.hedges,
        cancelled_on_server=cancelled,
        failed=failed,
    )


async def stats_of(url: str) -> dict[str, int]:
    async with GovernedClient(url) as client:
        return await client.stats()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--tail-ms", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=7)
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    slow_ms = 1500
    if smoke(args):  # a few calls, shorter slow executions
        args.calls, args.concurrency, args.tail_ms, slow_ms = 40, 8, 200, 200

    results: list[Result] = []
    observed = HedgePolicy(quantile=0.95, max_hedges=2, initial_delay_s=0.1)
    scenarios = [
        ("tail", [f"--exec-mix 20:0.9,{args.tail_ms}:0.1"], observed),
        ("slow+fast", [f"--exec-mix 20:0.5,{slow_ms}:0.5", "--exec-ms 20"], HedgePolicy.fixed(0.1)),
    ]
    for scenario, server_args, hedge in scenarios:
        for mode, policy in (("unhedged", None), ("hedged", hedge)):
            with ExitStack() as stack:
                common = ["--max-inflight", "256", "--seed", str(args.seed), "--grace-s", "0"]
                servers = [
                    stack.enter_context(spawn(*common, *shlex.split(extra)))
                    for extra in server_args
                ]
                urls = [s.url for s in servers]
                results.append(anyio.run(run_mode, scenario, mode, urls, policy, args))

    print(f"hedging: {args.calls} calls, {args.concurrency} callers, GovernedClient; latency in ms")
    header = (
        f"{'scenario':<10} {'mode':<9} {'p50':>7} {'p99':>7} {'max':>7} "
        f"{'att/req':>8} {'hedges':>7} {'cancelled':>10} {'failed':>7}"
    )
    print(header)
    for r in results:
        print(
            f"{r.scenario:<10} {r.mode:<9} {r.p50_ms:>7.1f} {r.p99_ms:>7.1f} {r.max_ms:>7.1f} "
            f"{r.attempts_per_request:>8.3f} {r.hedges:>7} {r.cancelled_on_server:>10} "
            f"{r.failed:>7}"
        )
    for scenario, _, _ in scenarios:
        base, hedged = (r for r in results if r.scenario == scenario)
        print(
            f"{scenario}: p99 ratio hedged/unhedged {hedged.p99_ms / base.p99_ms:.2f}, "
            f"p50 ratio {hedged.p50_ms / base.p50_ms:.2f}, attempts/request "
            f"{base.attempts_per_request:.3f} -> {hedged.attempts_per_request:.3f}"
        )
    return 1 if any(r.failed for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())

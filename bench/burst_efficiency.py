"""Benchmark: one burst, four client strategies, side by side.

400 submits fired at once at a fresh ``yieldgate serve --max-inflight 8
--exec-ms 50`` per strategy (so each sees the same server state):

- ``yieldgate``: ``GovernedClient`` with a default ``Gate``: yields narrow the
  window and are waited out around the hint, with jitter;
- ``naive``: one attempt each, no retry (a yield is a failure);
- ``tenacity``: exponential backoff with jitter, up to 10 attempts, blind to
  the server's hints (the common hand-rolled policy);
- ``openai-default``: the official openai-python policy: 2 retries, a server
  hint slept exactly (no jitter), else ``min(0.5 * 2**n, 8) * (1 - 0.25 * rand)``;
- ``oracle``: a client told the server's capacity: a Gate with a fixed window of
  exactly ``max_inflight`` slots, so it is never refused and never idles a
  slot. Not a strategy anyone can use, but the makespan this machine can reach
  (the per-request round trips and timer slack the lower bound leaves out).

The three baselines use the same multiplexed connection as ``yieldgate``
(``GovernedClient`` with a Gate that never retries and never limits), so only
the retry strategy differs. Reported per strategy: success rate, attempts per
request (from the server's counters: executed + yielded), yields, makespan and
its ratio to the lower bound ``requests * exec_ms / max_inflight``, and
latency percentiles. Goals for ``yieldgate``: 100% success, at most 1.05
attempts per request, makespan within 1.05x the lower bound (and its ratio to
the oracle's makespan, measured in the same run).

Run it (from the repository root)::

    .venv/bin/python bench/burst_efficiency.py
    .venv/bin/python bench/burst_efficiency.py --requests 400 --max-inflight 8 --exec-ms 50
    .venv/bin/python bench/burst_efficiency.py --smoke   # seconds: does it still run?
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import anyio
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
)

from _common import add_smoke_flag, exponential_jitter, smoke
from yieldgate import (
    BreakerPolicy,
    Gate,
    GatePolicy,
    GovernedClient,
    RetryPolicy,
    WindowPolicy,
    YieldExhaustedError,
    YieldgateError,
)
from yieldgate._stats import percentile
from yieldgate.server import ServerProcess, spawn

STRATEGIES = ("yieldgate", "naive", "tenacity", "openai-default", "oracle")

Attempt = Callable[[str], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class Result:
    strategy: str
    requests: int
    succeeded: int
    attempts: int
    yields: int
    makespan_s: float
    lower_bound_s: float
    p50_s: float
    p99_s: float

    @property
    def success_rate(self) -> float:
        return self.succeeded / self.requests

    @property
    def makespan_ratio(self) -> float:
        return self.makespan_s / self.lower_bound_s


def server(max_inflight: int, exec_ms: float) -> ServerProcess:
    """A fresh server; its log goes to this terminal."""
    args = ("--max-inflight", str(max_inflight), "--exec-ms", str(exec_ms), "--grace-s", "0")
    return spawn(*args, capture_stderr=False)


def transport_gate() -> Gate:
    """A Gate that only carries requests: one attempt, no waiting, no limit, no breaker."""
    return Gate(
        GatePolicy(
            retry=RetryPolicy.no_retry(),
            window=WindowPolicy.fixed(100_000),
            breaker=BreakerPolicy.disabled(),
        ),
        name="transport",
    )


def naive(attempt: Attempt) -> Attempt:
    return attempt


def tenacity_style(attempt: Attempt) -> Attempt:
    retrying = AsyncRetrying(
        stop=stop_after_attempt(10),
        wait=exponential_jitter(0.05, 5),
        retry=retry_if_exception_type(YieldExhaustedError),
        reraise=True,
    )

    async def call(body: str) -> object:
        return await retrying(attempt, body)

    return call


def openai_style(attempt: Attempt) -> Attempt:
    rng = random.Random(1)

    async def call(body: str) -> object:
        for n in range(3):  # the official default: max_retries=2
            try:
                return await attempt(body)
            except YieldExhaustedError as exc:
                if n == 2:
                    raise
                hint = exc.last_hint_s
                if hint is not None and 0 < hint <= 60:
                    await anyio.sleep(hint)  # exactly: every client wakes together
                else:
                    await anyio.sleep(min(0.5 * 2**n, 8) * (1 - 0.25 * rng.random()))
        raise AssertionError("unreachable")

    return call


def oracle_gate(max_inflight: int) -> Gate:
    """A Gate that knows the server's capacity: exactly ``max_inflight`` in flight."""
    return Gate(GatePolicy(window=WindowPolicy.fixed(max_inflight)), name="oracle")


async def run_strategy(
    strategy: str, url: str, requests: int, lower_bound_s: float, max_inflight: int
) -> Result:
    if strategy == "yieldgate":
        gate = Gate(name="burst")
    elif strategy == "oracle":
        gate = oracle_gate(max_inflight)
    else:
        gate = transport_gate()
    async with GovernedClient(url, gate=gate) as client:
        wrap = {
            "yieldgate": naive,
            "oracle": naive,
            "naive": naive,
            "tenacity": tenacity_style,
        }.get(strategy, openai_style)
        call = wrap(client.submit)
        latencies: list[float] = []
        succeeded = 0
        started = time.monotonic()

        async def one(i: int) -> None:
            nonlocal succeeded
            t0 = time.monotonic()
            try:
                await call(f"request {i}")
            except YieldgateError:
                return
            succeeded += 1
            latencies.append(time.monotonic() - t0)

        async with anyio.create_task_group() as tg:
            for i in range(requests):
                tg.start_soon(one, i)
        makespan = time.monotonic() - started
        stats = await client.stats()
    return Result(
        strategy=strategy,
        requests=requests,
        succeeded=succeeded,
        attempts=stats["executed_total"] + stats["yielded_total"],
        yields=stats["yielded_total"],
        makespan_s=makespan,
        lower_bound_s=lower_bound_s,
        p50_s=percentile(latencies, 50, default=0.0),
        p99_s=percentile(latencies, 99, default=0.0),
    )


def table(results: Sequence[Result]) -> str:
    head = (
        f"{'strategy':<15} {'success':>8} {'attempts/req':>13} {'yields':>7}"
        f" {'makespan s':>11} {'x lower bound':>14} {'p50 s':>7} {'p99 s':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(
            f"{r.strategy:<15} {r.success_rate:>8.1%} {r.attempts / r.requests:>13.2f}"
            f" {r.yields:>7} {r.makespan_s:>11.2f} {r.makespan_ratio:>14.2f}"
            f" {r.p50_s:>7.2f} {r.p99_s:>7.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--max-inflight", type=int, default=8)
    parser.add_argument("--exec-ms", type=float, default=50.0)
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.requests, args.exec_ms = 24, 5.0

    lower_bound = args.requests * args.exec_ms / 1000 / args.max_inflight
    results = []
    for strategy in args.strategies:
        with server(args.max_inflight, args.exec_ms) as process:
            results.append(
                anyio.run(
                    run_strategy,
                    strategy,
                    process.url,
                    args.requests,
                    lower_bound,
                    args.max_inflight,
                    backend_options={"use_uvloop": True},
                )
            )
    print(
        f"{args.requests} requests at once, max_inflight {args.max_inflight}, "
        f"{args.exec_ms:g} ms each; lower bound {lower_bound:.2f} s; {os.cpu_count()} CPUs"
    )
    print(table(results))
    oracle = next((r for r in results if r.strategy == "oracle"), None)
    for r in results:
        if r.strategy == "yieldgate":
            versus = (
                ""
                if oracle is None
                else f", {r.makespan_s / oracle.makespan_s:.3f}x the oracle's makespan"
            )
            print(
                f"yieldgate: success {r.success_rate:.1%} (goal 100%), "
                f"{r.attempts / r.requests:.3f} attempts/request (goal <= 1.05), "
                f"makespan {r.makespan_ratio:.3f}x the lower bound (goal <= 1.05){versus}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

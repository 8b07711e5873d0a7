"""Benchmark: a burst past a provider's token quota, client strategies side by side.

400 chat completions of mixed sizes fired at once through ``openai.AsyncOpenAI``
at a fresh ``yieldgate serve --quota-tpm T --quota-rpm R`` per strategy, its
token quota exceeded by half (the burst costs 1.5 x T, by the server's rule:
prompt characters / 4 plus ``max_tokens``). The server emulates OpenAI's
quota: buckets that refill continuously and hold one window's limit, the
``x-ratelimit-*`` headers on every answer, a 429 ``rate_limit_exceeded``
whose message says when to try again (no ``retry-after`` for tokens).

- ``gate``: ``yieldgate.openai_client(Gate())``: configured with nothing, it
  learns the quota from the headers and paces the burst;
- ``gate+policy``: the same with ``QuotaPolicy(tokens_per_minute=T,
  requests_per_minute=R, settle="estimate")`` told the quota up front, charged
  as the server's quota charges, at the door (valid for a 60 s window);
- ``gate+usage``: the same budgets settled to each response's ``usage`` (the
  default). The reference server's usage counts its byte-level tokens, four
  times the quota's four-characters-a-token rule, so these budgets are spent
  four times faster than the quota: the row shows the cost of a budget kept
  in another unit than the usage reported;
- ``openai``: the client's own retries (``max_retries=2``, its default);
- ``tenacity``: ``AsyncRetrying`` on ``RateLimitError``, exponential backoff
  with jitter (1 s to 60 s), up to 10 attempts;
- ``litellm``: LiteLLM's ``Router`` with the deployment's ``tpm`` and ``rpm``
  set to the quota (``usage-based-routing-v2``, pre-call checks on), the one
  widely used client with token budgets. Run when ``litellm`` imports: in
  the compat environment (``make compat``), which has yieldgate too;
- ``token-throttle``: its ``RateLimiter`` on a Redis backend (a fresh
  redis-server per run, as the fleet tests start it) with the quota's exact
  limits and window, each request reserved before the call at the quota's
  charge and refunded from the response's ``usage`` after it, as its README
  does (``bench/tt_member.py``), through ``AsyncOpenAI`` with its default
  retries. Run when ``token_throttle`` imports: in ``.venv-tt`` (``make tt``,
  Python 3.12+), which has yieldgate too;
- ``token-throttle@estimate``: the same limiter, each call settled with an
  actual usage equal to its reservation (the quota's own charge) instead of
  the response's: its budget kept in the quota's unit, as ``gate+policy``'s.

Per strategy: success, the server's 429s (quota refusals) per request,
makespan and its ratio to the quota's bound (the burst's cost beyond the
first full bucket, at the refill rate), and the refill used: tokens charged
beyond the first bucket per second of the burst, over the refill rate (1.0:
every token the quota refilled was spent; a strategy that leaves requests
failed spends less than the burst's cost, and may show more than its share
of the time).

Run it (from the repository root)::

    .venv-compat/bin/python bench/quota.py            # with LiteLLM
    .venv-tt/bin/python bench/quota.py                # with token-throttle
    .venv-tt/bin/python bench/quota.py --only token-throttle token-throttle@estimate
    .venv/bin/python bench/quota.py                   # without it
    .venv/bin/python bench/quota.py --window-s 12 --requests 200   # quicker
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import math
import os
import platform
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai

import yieldgate
from _common import add_smoke_flag, smoke
from yieldgate import Gate, GatePolicy, QuotaPolicy
from yieldgate.server import ServerProcess, spawn

MODEL = "gpt-4o"
ROOT = Path(__file__).resolve().parents[1]
NAME_W = len("token-throttle@estimate")  # the strategy column


@dataclass(frozen=True)
class Burst:
    jobs: list[tuple[str, int]]
    tpm: int
    rpm: int
    window_s: float

    @property
    def cost(self) -> int:
        return sum(math.ceil(len(f"user: {t}") / 4) + m for t, m in self.jobs)

    @property
    def bound_s(self) -> float:
        return max(0.0, (self.cost - self.tpm) / (self.tpm / self.window_s))


def make_burst(requests: int, excess: float, window_s: float, seed: int) -> Burst:
    rng = random.Random(seed)
    jobs = [
        ("lorem ipsum " * rng.choice((2, 20, 80)), rng.choice((16, 64, 256)))
        for _ in range(requests)
    ]
    cost = sum(math.ceil(len(f"user: {t}") / 4) + m for t, m in jobs)
    return Burst(jobs, math.ceil(cost / excess), requests * 10, window_s)


@dataclass
class Result:
    name: str
    ok: int
    requests: int
    refused: int
    makespan_s: float
    bound_s: float
    tokens: int
    tpm: int
    window_s: float

    def row(self) -> str:
        # The refill the burst used: tokens charged past the first full bucket, per
        # second of the burst, against the refill rate.
        rate = self.tpm / self.window_s
        refill = (self.tokens - self.tpm) / self.makespan_s / rate if self.makespan_s else 0.0
        return (
            f"{self.name:<{NAME_W}} {100 * self.ok / self.requests:>7.1f}% {self.refused:>6} "
            f"{self.refused / self.requests:>8.2f} {self.makespan_s:>9.1f} "
            f"{self.makespan_s / self.bound_s:>7.2f} {refill:>7.2f}"
        )


Call = Callable[[str, int], Awaitable[Any]]


async def run_burst(call: Call, burst: Burst) -> tuple[int, float]:
    start = time.monotonic()
    results = await asyncio.gather(*(call(t, m) for t, m in burst.jobs), return_exceptions=True)
    return sum(not isinstance(r, BaseException) for r in results), time.monotonic() - start


def messages(text: str) -> Any:
    return [{"role": "user", "content": text}]


async def gate_strategy(url: str, burst: Burst, policy: GatePolicy) -> tuple[int, float]:
    gate = Gate(policy, name="provider")
    async with yieldgate.openai_client(gate, base_url=f"{url}/v1", api_key="unused") as client:

        async def call(text: str, max_tokens: int) -> Any:
            return await client.chat.completions.create(
                model=MODEL, messages=messages(text), max_tokens=max_tokens
            )

        return await run_burst(call, burst)


async def openai_strategy(url: str, burst: Burst) -> tuple[int, float]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:

        async def call(text: str, max_tokens: int) -> Any:
            return await client.chat.completions.create(
                model=MODEL, messages=messages(text), max_tokens=max_tokens
            )

        return await run_burst(call, burst)


async def tenacity_strategy(url: str, burst: Burst) -> tuple[int, float]:
    from tenacity import (
        AsyncRetrying,
        retry_if_exception_type,
        stop_after_attempt,
        wait_random_exponential,
    )

    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as c:

        async def call(text: str, max_tokens: int) -> Any:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(openai.RateLimitError),
                wait=wait_random_exponential(multiplier=1, max=60),
                stop=stop_after_attempt(10),
                reraise=True,
            ):
                with attempt:
                    return await c.chat.completions.create(
                        model=MODEL, messages=messages(text), max_tokens=max_tokens
                    )
            return None

        return await run_burst(call, burst)


async def litellm_strategy(url: str, burst: Burst) -> tuple[int, float]:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import
    import litellm

    litellm.suppress_debug_info = True
    router = litellm.Router(
        model_list=[
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": f"{url}/v1",
                    "api_key": "unused",
                    "tpm": burst.tpm,
                    "rpm": burst.rpm,
                },
            }
        ],
        routing_strategy="usage-based-routing-v2",
        enable_pre_call_checks=True,
        num_retries=3,
    )

    async def call(text: str, max_tokens: int) -> Any:
        return await router.acompletion(model=MODEL, messages=messages(text), max_tokens=max_tokens)

    return await run_burst(call, burst)


async def token_throttle_strategy(url: str, burst: Burst, settle: str) -> tuple[int, float]:
    sys.path.insert(0, str(ROOT))  # Redis as the fleet tests start it
    from tests.fleet.conftest import RedisServer
    from tt_member import limiter, throttled

    redis = RedisServer(Path(tempfile.mkdtemp(prefix="yieldgate-bench-redis-")))
    redis.start()
    try:
        limit, redis_client = limiter(
            redis.url,
            f"bench-quota-{uuid.uuid4().hex[:8]}",
            tpm=burst.tpm,
            rpm=burst.rpm,
            window_s=burst.window_s,
            concurrency=len(burst.jobs),
        )
        try:
            async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused") as client:

                async def call(text: str, max_tokens: int) -> Any:
                    return await throttled(limit, client, text, max_tokens, settle=settle)

                return await run_burst(call, burst)
        finally:
            await limit.aclose()
            await redis_client.aclose()
    finally:
        redis.stop()


def stats(server: ServerProcess) -> dict[str, Any]:
    response = httpx.get(f"{server.http_url}/stats", timeout=10)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def measure(name: str, burst: Burst) -> Result:
    args = (
        "--http-port", "0", "--exec-ms", "20", "--max-inflight", "256",
        "--quota-tpm", str(burst.tpm), "--quota-rpm", str(burst.rpm),
        "--quota-window-s", str(burst.window_s),
    )  # fmt: skip
    with spawn(*args, http=True) as server:
        url = server.http_url
        policy = QuotaPolicy(tokens_per_minute=burst.tpm, requests_per_minute=burst.rpm)
        estimate = dataclasses.replace(policy, settle="estimate")
        runs: dict[str, Callable[[], Awaitable[tuple[int, float]]]] = {
            "gate": lambda: gate_strategy(url, burst, GatePolicy()),
            "gate+policy": lambda: gate_strategy(url, burst, GatePolicy(quota=estimate)),
            "gate+usage": lambda: gate_strategy(url, burst, GatePolicy(quota=policy)),
            "openai": lambda: openai_strategy(url, burst),
            "tenacity": lambda: tenacity_strategy(url, burst),
            "litellm": lambda: litellm_strategy(url, burst),
            "token-throttle": lambda: token_throttle_strategy(url, burst, "usage"),
            "token-throttle@estimate": lambda: token_throttle_strategy(url, burst, "estimate"),
        }
        ok, makespan = asyncio.run(runs[name]())
        counters = stats(server)
    refused = counters["quota_refused_tokens_total"] + counters["quota_refused_requests_total"]
    return Result(
        name,
        ok,
        len(burst.jobs),
        refused,
        makespan,
        burst.bound_s,
        counters["quota_tokens_charged_total"],
        burst.tpm,
        burst.window_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--excess", type=float, default=1.5, help="burst cost / token quota")
    parser.add_argument("--window-s", type=float, default=60.0, help="the quota's window")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--only", nargs="*", help="strategies to run (default: all available)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    quick = smoke(args)
    if quick:  # a few requests, a 2 s window (the per-minute policies' rows left out)
        args.requests, args.window_s = 12, 2.0
    burst = make_burst(args.requests, args.excess, args.window_s, args.seed)
    names = ["gate", "gate+policy", "gate+usage", "openai", "tenacity", "litellm"]
    names += ["token-throttle", "token-throttle@estimate"]
    if importlib.util.find_spec("litellm") is None:
        names.remove("litellm")
    if importlib.util.find_spec("token_throttle") is None:
        names.remove("token-throttle")
        names.remove("token-throttle@estimate")
    if args.window_s != 60.0:
        names.remove("gate+policy")  # their budgets are per minute
        names.remove("gate+usage")
    if args.only:
        names = [n for n in names if n in args.only]
    if quick and "litellm" in names:
        names.remove("litellm")  # its minute's counters make a 2 s window last minutes
        print("(litellm: left out of the smoke run, its counters are per minute)")
    print(
        f"{platform.python_version()} on {platform.machine()}, {os.cpu_count()} CPUs; "
        f"openai {openai.__version__}; {args.requests} requests costing {burst.cost} tokens "
        f"against {burst.tpm} per {args.window_s:g} s ({args.excess}x); "
        f"the quota's bound: {burst.bound_s:.1f} s"
    )
    if "litellm" not in names and not args.only and not quick:
        print("(litellm not installed here: run in .venv-compat for its row)")
    if "token-throttle" not in names and not args.only:
        print("(token-throttle not installed here: run in .venv-tt for its row)")
    print(
        f"{'strategy':<{NAME_W}} {'success':>8} {'429s':>6} {'429/req':>8} {'makespan':>9} "
        f"{'/bound':>7} {'refill':>7}"
    )
    for name in names:
        result = measure(name, burst)
        print(result.row(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

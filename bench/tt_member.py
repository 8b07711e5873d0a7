"""A fleet member on token-throttle, as its own process: bench/fleet.py's token-throttle row.

The shape of ``tests/fleet/member.py``: it says ``ready`` once its limiter
answers from Redis, starts when its standard input says ``go``, fires
``--requests`` chat completions at once through ``AsyncOpenAI`` (its default
retries, ``max_retries=2``), each reserved before the call on a token-throttle
``RateLimiter`` with a Redis backend (key prefix ``--name``: one budget for
every member started with that name) and refunded from the response's usage
after it (``--settle usage``, the default; ``--settle estimate`` refunds
nothing instead, see ``throttled``), and prints one JSON line with the
fields bench/fleet.py reads.

Configured as token-throttle 14's README does it: ``RateLimiter(PerModelConfig(
quotas=UsageQuotas([Quota("requests", ...), Quota("tokens", ...)]),
usage_counter=...), backend=RedisBackendBuilder(...))``, then
``acquire_capacity_for_request(**request)`` and ``refund_capacity_from_response``
(a failed call refunds ``{"requests": 1, "tokens": 0}``), its Redis client on
a ``BlockingConnectionPool`` as ``RedisBackendBuilder`` advises. Not its OpenAI
helper, ``create_openai_redis_rate_limiter``: it takes per-minute limits only
(the fleet's quota window is 12 s) and counts with tiktoken, whose encoding
it downloads; the counter here charges what the quota charges.

bench/quota.py's token-throttle rows use ``limiter`` and ``throttled`` from here.

Run it (token-throttle needs Python 3.12+: ``make tt`` builds ``.venv-tt``)::

    .venv-tt/bin/python bench/tt_member.py --server URL --redis URL --tpm T --window-s 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import redis.asyncio as aioredis
from token_throttle import PerModelConfig, Quota, RateLimiter, RedisBackendBuilder, UsageQuotas

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the members' jobs are the fleet tests'

from tests.fleet.member import fire, jobs  # noqa: E402

MODEL = "gpt-4o"
# Connections past the concurrent acquires: its locks, TIME and pipelines.
POOL_HEADROOM = 32


def estimate(**request: Any) -> dict[str, int]:
    """What the quota charges: ``ceil(prompt characters / 4) + max_tokens``."""
    prompt = "\n".join(f"{m['role']}: {m['content']}" for m in request["messages"])
    return {"requests": 1, "tokens": math.ceil(len(prompt) / 4) + request["max_tokens"]}


def limiter(
    redis_url: str, key_prefix: str, *, tpm: int, rpm: int, window_s: float, concurrency: int
) -> tuple[RateLimiter, aioredis.Redis]:
    """A limiter on the quota's exact limits and window, and its Redis client (close both).

    Its Redis client has the pool ``RedisBackendBuilder``'s docstring prefers, a
    ``BlockingConnectionPool`` sized to the concurrent acquires plus headroom:
    redis-py's default pool holds 100 connections and raises past them, which
    fails most of a 400-call burst (``MaxConnectionsError``).
    """
    if window_s != round(window_s):
        raise ValueError(f"token-throttle's windows are whole seconds, not {window_s}")
    # A line per request whose usage exceeds its reservation, here nearly all: the
    # reference server's usage counts bytes, four a token by the quota's rule.
    logging.getLogger("token_throttle.refund").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", "Actual usage", RuntimeWarning)
    # The counter is a sum over one message: nothing to move off the event loop.
    warnings.filterwarnings("ignore", "Synchronous usage_counter", UserWarning)
    pool = aioredis.BlockingConnectionPool.from_url(
        redis_url, max_connections=concurrency + POOL_HEADROOM
    )
    client = aioredis.Redis(connection_pool=pool)
    config = PerModelConfig(
        quotas=UsageQuotas(
            [
                Quota(metric="requests", limit=rpm, per_seconds=round(window_s)),
                Quota(metric="tokens", limit=tpm, per_seconds=round(window_s)),
            ]
        ),
        usage_counter=estimate,
    )
    backend = RedisBackendBuilder(client, key_prefix=key_prefix)
    return RateLimiter(config, backend=backend), client


SETTLES = ("usage", "estimate")


async def throttled(
    limit: RateLimiter,
    client: openai.AsyncOpenAI,
    text: str,
    max_tokens: int,
    *,
    settle: str = "usage",
) -> Any:
    """One chat completion: reserved before at the quota's charge, settled after.

    ``settle="usage"`` refunds from the response's usage, as token-throttle's
    README does: the reference server's usage counts its byte-level tokens,
    about four times the quota's rule for the prompt, so the budget is spent
    faster than the quota. ``settle="estimate"`` settles with an actual usage
    equal to the reservation (the quota's own charge, in the quota's unit, as
    ``QuotaPolicy(settle="estimate")`` keeps the door's charge): nothing
    comes back. A failed call refunds its tokens either way.
    """
    if settle not in SETTLES:
        raise ValueError(f"settle must be one of {SETTLES}, not {settle!r}")
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }
    reservation = await limit.acquire_capacity_for_request(**request)
    try:
        response = await client.chat.completions.create(**request)
    except Exception:
        await limit.refund_capacity({"requests": 1, "tokens": 0}, reservation)
        raise
    if settle == "estimate":
        await limit.refund_capacity(dict(reservation.usage), reservation)
    else:
        await limit.refund_capacity_from_response(reservation, response)
    return response


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # Each --gates is its own limiter and client on the one key prefix, as members.
    made = [
        limiter(
            args.redis,
            args.name,
            tpm=args.tpm,
            rpm=args.rpm,
            window_s=args.window_s,
            concurrency=args.requests,
        )
        for _ in range(args.gates)
    ]
    clients = [openai.AsyncOpenAI(base_url=f"{args.server}/v1", api_key="unused") for _ in made]
    for _, redis_client in made:
        await redis_client.ping()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go"

    def one(
        limit: RateLimiter, client: openai.AsyncOpenAI, text: str, m: int
    ) -> Callable[[], Awaitable[Any]]:
        return lambda: throttled(limit, client, text, m, settle=args.settle)

    report = await fire(
        [
            one(limit, client, *job)
            for g, ((limit, _), client) in enumerate(zip(made, clients, strict=True))
            for job in jobs(args.requests, args.seed * args.gates + g)
        ]
    )
    for (limit, redis_client), client in zip(made, clients, strict=True):
        await client.close()
        await limit.aclose()
        await redis_client.aclose()
    return {**report, "fleet": None}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="fleet-tt", help="the limiter's Redis key prefix")
    parser.add_argument("--tpm", type=int, required=True, help="the quota's tokens per window")
    parser.add_argument("--rpm", type=int, required=True, help="the quota's requests per window")
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--gates", type=int, default=1, help="limiters in this process")
    parser.add_argument(
        "--settle", choices=SETTLES, default="usage", help="refund from: see throttled"
    )
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
    sys.exit(0)

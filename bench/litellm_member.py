"""A fleet member on LiteLLM's Router, as its own process: bench/fleet.py's litellm row.

The shape of ``tests/fleet/member.py`` and ``bench/tt_member.py``: it says
``ready`` once its Routers answer from Redis, starts when its standard input
says ``go``, fires ``--requests`` chat completions at once through
``Router.acompletion``, and prints one JSON line with the fields
bench/fleet.py reads.

Each Router is configured as bench/quota.py's ``litellm`` row configures its
own: one deployment whose ``tpm`` and ``rpm`` are the quota's,
``routing_strategy="usage-based-routing-v2"``, ``enable_pre_call_checks=True``,
``num_retries=3``; and, to share its usage counters with the fleet's other
Routers, LiteLLM's documented way, ``Router(redis_host=..., redis_port=...)``
(usage-based-routing-v2 then keeps its per-minute counters in Redis, its
writes batched every 0.1 s). Every member's deployment is the same
(``model_list`` alike, so the same generated deployment id): one set of
counters for the fleet.

LiteLLM's limits are per minute (counters keyed by the calendar minute):
``--tpm`` and ``--rpm`` are the quota's per ``--window-s``, and the
deployment's ``tpm``/``rpm`` the same rate per minute (``limit * 60 /
window_s``; the fleet's 12 s window gives five times the quota's limit).
Its token counters count the response's ``usage`` (the reference server's
byte-level tokens), its pre-call check the prompt by its tokenizer.

With ``--gates`` above 1, note that LiteLLM registers each Router's usage
tracker as a process-wide callback: each call's tokens are counted once per
Router in the process.

Run it (LiteLLM is in the compat environment, ``make compat``; its Redis
cache needs the ``redis`` package there)::

    .venv-compat/bin/python bench/litellm_member.py --server URL --redis URL --tpm T --window-s 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch at import

import litellm

litellm.suppress_debug_info = True

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the members' jobs are the fleet tests'

from tests.fleet.member import fire, jobs  # noqa: E402

MODEL = "gpt-4o"


def router(server: str, redis_url: str, *, tpm: int, rpm: int, window_s: float) -> litellm.Router:
    """A Router on the quota's rate, its usage kept in the Redis at ``redis_url``."""
    redis = urlsplit(redis_url)
    per_minute = 60.0 / window_s
    return litellm.Router(
        model_list=[
            {
                "model_name": MODEL,
                "litellm_params": {
                    "model": f"openai/{MODEL}",
                    "api_base": f"{server}/v1",
                    "api_key": "unused",
                    "tpm": round(tpm * per_minute),
                    "rpm": round(rpm * per_minute),
                },
            }
        ],
        routing_strategy="usage-based-routing-v2",
        enable_pre_call_checks=True,
        num_retries=3,
        redis_host=redis.hostname,
        redis_port=redis.port,
    )


async def main(args: argparse.Namespace) -> dict[str, Any]:
    # Routers are built on the running loop: usage-based-routing-v2 starts its
    # Redis sync task on it.
    routers = [
        router(args.server, args.redis, tpm=args.tpm, rpm=args.rpm, window_s=args.window_s)
        for _ in range(args.gates)
    ]
    for r in routers:
        assert r.cache.redis_cache is not None, "the Router has no Redis cache"
        await r.cache.redis_cache.ping()
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go"

    def one(r: litellm.Router, text: str, max_tokens: int) -> Callable[[], Awaitable[Any]]:
        return lambda: r.acompletion(
            model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens
        )

    report = await fire(
        [
            one(r, *job)
            for g, r in enumerate(routers)
            for job in jobs(args.requests, args.seed * args.gates + g)
        ]
    )
    for r in routers:
        r.discard()
        if r.cache.redis_cache is not None:
            await r.cache.redis_cache.disconnect()
    return {**report, "fleet": None}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--redis", required=True)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tpm", type=int, required=True, help="the quota's tokens per window")
    parser.add_argument("--rpm", type=int, required=True, help="the quota's requests per window")
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--gates", type=int, default=1, help="Routers in this process")
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
    sys.exit(0)

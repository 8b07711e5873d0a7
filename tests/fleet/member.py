"""One member of a fleet, as its own process: a burst of chat completions through one Gate.

Run by the fleet's end-to-end tests and bench/fleet.py (``python
tests/fleet/member.py ...``): it says ``ready`` once it has joined the fleet
(its first heartbeat), starts when its standard input says ``go`` (so that
every member starts together), fires ``--requests`` chat completions at once
through ``AsyncOpenAI`` on ``yieldgate.openai_client(Gate(name=...,
shared=--redis))`` (or an unshared Gate without ``--redis``), and prints one
JSON line: how many succeeded, the errors, when each call completed (seconds
after the start) and the fleet link's statistics.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from typing import Any

import yieldgate
from yieldgate import FleetPolicy, Gate, GatePolicy, RetryPolicy


def jobs(requests: int, seed: int) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    return [("x" * rng.choice((20, 200, 800)), rng.choice((16, 64, 128))) for _ in range(requests)]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    policy = GatePolicy(
        retry=RetryPolicy(max_yields=10_000),
        fleet=FleetPolicy(
            inflight_cap=args.cap, lease_ttl_s=args.lease_ttl_s, budget_s=args.budget_s
        ),
    )
    gate = Gate(policy, name="fleet-e2e", shared=args.redis)
    client = yieldgate.openai_client(gate, base_url=f"{args.server}/v1", api_key="unused")
    done: list[float] = []
    errors: list[str] = []
    shared = gate._core.shared
    if shared is not None:
        await shared.fleet.heartbeat(gate.name)  # a member from the start: its share is right
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # "go"
    start = time.monotonic()

    async def one(text: str, max_tokens: int) -> None:
        try:
            await client.chat.completions.create(
                model="gpt-4o",
                messages=[{"role": "user", "content": text}],
                max_tokens=max_tokens,
                extra_body={"backend_params": {"exec_ms": args.exec_ms}}
                if args.exec_ms is not None
                else None,
            )
        except Exception as exc:  # reported, not raised: the test reads them
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            done.append(time.monotonic() - start)

    await asyncio.gather(*(one(*job) for job in jobs(args.requests, args.seed)))
    stats = None if shared is None else shared.fleet.statistics()
    gate_stats = gate.statistics()
    await client.close()
    await gate.aclose()
    return {
        "ok": len(done),
        "errors": errors[:5],
        "failed": len(errors),
        "done": sorted(done),
        "makespan": time.monotonic() - start,
        "attempts": gate_stats.attempts,
        "waited_s": gate_stats.waited_s,
        "fleet": None if stats is None else {
            "fallbacks": stats.fallbacks, "outages": stats.outages, "rejoins": stats.rejoins,
        },
    }  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--redis")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cap", type=int)
    parser.add_argument("--lease-ttl-s", type=float, default=60.0)
    parser.add_argument("--exec-ms", type=float)
    # Generous by default: the tests must pass on a machine whose cores are all busy.
    parser.add_argument("--budget-s", type=float, default=1.0)
    result = asyncio.run(main(parser.parse_args()))
    print(json.dumps(result))
    sys.exit(0)

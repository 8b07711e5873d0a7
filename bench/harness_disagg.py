"""Benchmark: short-prompt TTFT while long prompts arrive, colocated vs disaggregated prefill.

What it measures. The same seeded arrival schedule is replayed against two
harness backends in one run:

- ``colocated``: ``--prefill-workers 0``: every prompt is prefilled on the
  decode worker, between its decode steps;
- ``disaggregated``: one prefill worker process; the router sends prompts of
  at least ``--offload-threshold`` tokens to it, and their KV comes back over
  torch.distributed (gloo).

Short requests (``--short-tokens`` bytes, ``--short-max-tokens`` out) arrive
as a Poisson process at ``--short-rate`` per second; long ones
(``--long-tokens`` bytes, ``--long-max-tokens`` out) at ``--long-rate``. Each
request runs through ``HarnessBackend.execute`` in-process (no network), and
its TTFT is the one the backend reports (admission to first token). The
figure that matters: short-prompt TTFT p99, disaggregated over colocated
(goal: <= 0.5). A long prefill stalls every colocated decode step behind it;
disaggregation moves that compute to another process.

Every process runs torch on one thread. On a 2-CPU machine the decode worker
and the prefill worker get one core each; the colocated run uses one.

Run it (from the repository root)::

    .venv/bin/python bench/harness_disagg.py
    .venv/bin/python bench/harness_disagg.py --duration 20 --json bench-disagg.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.router import RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig

GOAL_RATIO = 0.5


@dataclass(slots=True)
class Outcome:
    mode: str
    short_ttft: list[float] = field(default_factory=list)
    long_ttft: list[float] = field(default_factory=list)
    short_tpot: list[float] = field(default_factory=list)
    offloaded: int = 0
    errors: int = 0


def schedule(args: argparse.Namespace) -> list[tuple[float, str]]:
    """Arrival times and kinds, from one seeded generator (the same for both modes)."""
    rng = random.Random(args.seed)
    arrivals: list[tuple[float, str]] = []
    for kind, rate in (("short", args.short_rate), ("long", args.long_rate)):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= args.duration:
                break
            arrivals.append((t, kind))
    arrivals.sort()
    return arrivals


def prompt(kind: str, i: int, args: argparse.Namespace) -> str:
    # Distinct from the first byte on, so no request hits the prefix cache.
    length = args.short_tokens if kind == "short" else args.long_tokens
    text = f"{i:05d} {kind}: " + "the quick brown fox jumps over the lazy dog " * 200
    return text[:length]


async def run_mode(
    mode: str, arrivals: list[tuple[float, str]], args: argparse.Namespace
) -> Outcome:
    workers = 1 if mode == "disaggregated" else 0
    backend = HarnessBackend(
        HarnessConfig(
            engine=EngineConfig(
                device=args.device,
                num_blocks=4096,
                scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096),
            ),
            prefill_workers=workers,
            router=RouterConfig(
                prefill_length_threshold=args.offload_threshold,
                busy_length_threshold=args.offload_threshold,
                max_prefill_queue=64,
            ),
        )
    )
    await backend.start(Governor(GovernorConfig(max_inflight=64)))
    outcome = Outcome(mode)
    try:
        started = time.monotonic()

        async def one(i: int, kind: str) -> None:
            max_tokens = args.short_max_tokens if kind == "short" else args.long_max_tokens
            work = Work(id=str(i), body=prompt(kind, i, args), params={"max_tokens": max_tokens})
            try:
                result = await backend.execute(work, None)
            except Exception:
                outcome.errors += 1
                return
            if kind == "short":
                outcome.short_ttft.append(result["ttft_ms"])
                outcome.short_tpot.append(result["tpot_ms"])
            else:
                outcome.long_ttft.append(result["ttft_ms"])

        async with anyio.create_task_group() as tg:
            for i, (at, kind) in enumerate(arrivals):
                delay = started + at - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(one, i, kind)
        outcome.offloaded = backend.stats().get("remote_prefills", 0)
    finally:
        await backend.aclose()
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    parser.add_argument("--short-rate", type=float, default=8.0, help="short requests per second")
    parser.add_argument("--long-rate", type=float, default=0.5, help="long requests per second")
    parser.add_argument("--short-tokens", type=int, default=24)
    parser.add_argument("--long-tokens", type=int, default=1536)
    parser.add_argument("--short-max-tokens", type=int, default=32)
    parser.add_argument("--long-max-tokens", type=int, default=4)
    parser.add_argument("--offload-threshold", type=int, default=256)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):  # a second of arrivals, shorter long prompts
        args.duration, args.long_tokens = 1.0, 384
    torch.set_num_threads(1)

    arrivals = schedule(args)
    outcomes = [
        anyio.run(run_mode, mode, arrivals, args) for mode in ("colocated", "disaggregated")
    ]

    shorts = sum(1 for _, kind in arrivals if kind == "short")
    print(
        f"harness disaggregation, {args.duration:.0f} s of arrivals: {shorts} short "
        f"({args.short_tokens} tokens in, {args.short_max_tokens} out), "
        f"{len(arrivals) - shorts} long ({args.long_tokens} in, {args.long_max_tokens} out); "
        f"torch {torch.__version__}, {platform.machine()}"
    )
    print(
        f"{'mode':<14} {'short TTFT p50':>14} {'p95':>8} {'p99':>8} {'short TPOT p50':>15} "
        f"{'long TTFT p50':>14} {'offloaded':>9} {'errors':>6}"
    )
    rows: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        row = {
            "short_ttft_ms": {
                key: percentile(o.short_ttft, p, default=math.nan)
                for key, p in (("p50", 50), ("p95", 95), ("p99", 99))
            },
            "short_tpot_ms_p50": percentile(o.short_tpot, 50, default=math.nan),
            "long_ttft_ms_p50": percentile(o.long_ttft, 50, default=math.nan),
            "offloaded": o.offloaded,
            "errors": o.errors,
        }
        rows[o.mode] = row
        t = row["short_ttft_ms"]
        print(
            f"{o.mode:<14} {t['p50']:>14.1f} {t['p95']:>8.1f} {t['p99']:>8.1f} "
            f"{row['short_tpot_ms_p50']:>15.2f} {row['long_ttft_ms_p50']:>14.1f} "
            f"{o.offloaded:>9} {o.errors:>6}"
        )
    ratio = (
        rows["disaggregated"]["short_ttft_ms"]["p99"] / rows["colocated"]["short_ttft_ms"]["p99"]
    )
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(
        f"short TTFT p99, disaggregated / colocated: {ratio:.2f} (goal <= {GOAL_RATIO}: {verdict})"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "modes": rows, "ratio_p99": ratio}, f, indent=2)
    return 1 if any(o.errors for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

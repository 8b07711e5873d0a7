"""Benchmark: high-priority TTFT p99 during a low-priority flood, with and without degradation.

What it measures. The same seeded arrival schedule is replayed against two
harness backends (one prefill worker process each) in one run:

- ``plain``: no degradation, no early rejection: the flood's long prompts
  queue at the prefill worker with the high-priority ones, and its long
  outputs fill the decode batch;
- ``degrade``: graceful degradation (``HarnessConfig.degrade``): while the
  worker holds ``--high-busy-jobs`` high-priority prefills, low-priority
  prompts are prefilled on the decode worker; when the QoS estimate stays
  above the low objective for ``--sustain-s``, low-priority outputs are cut
  to ``--cut-tokens``, and above ``--reject-pressure`` times the objective
  they are refused (``yield``);
- ``no-local``: the same without the local prefill (shorter outputs and
  rejection only), to tell the two forms' effects apart.

High-priority requests (``--high-tokens`` bytes in, ``--high-max-tokens``
out) arrive as a Poisson process at ``--high-rate`` per second; the flood
(``--low-tokens`` in, ``--low-max-tokens`` out) at ``--low-rate``. Every
request asks the Governor first (``try_acquire``, as a front does, with the
backend's admission hook), and a yielded one is not retried. The figure
that matters: high-priority TTFT p99, degrade over plain (goal: <= 0.5);
no-local over plain is printed beside it.
The machine's speed drifts (it is shared), so each mode runs ``--rounds``
times in alternating order and the percentiles are over all rounds.

Run it (from the repository root)::

    .venv/bin/python bench/harness_degrade.py
    .venv/bin/python bench/harness_degrade.py --quick
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

from yieldgate._stats import percentile
from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.degrade import DegradeConfig, DegradeLevel
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.qos import SloConfig
from yieldgate.harness.router import RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.protocol import Priority
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig, PriorityPolicy, Slot

GOAL_RATIO = 0.5
MODES = ("plain", "degrade", "no-local")


@dataclass(slots=True)
class Outcome:
    mode: str
    high_ttft: list[float] = field(default_factory=list)
    high_yielded: int = 0
    low_served: int = 0
    low_yielded: int = 0
    low_cut: int = 0
    low_tokens: int = 0
    local_for_high: int = 0
    errors: int = 0


def schedule(args: argparse.Namespace) -> list[tuple[float, Priority]]:
    """Arrival times and priorities, from one seeded generator (the same for both modes)."""
    rng = random.Random(args.seed)
    arrivals: list[tuple[float, Priority]] = []
    for priority, rate in ((Priority.HIGH, args.high_rate), (Priority.LOW, args.low_rate)):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= args.duration:
                break
            arrivals.append((t, priority))
    arrivals.sort()
    return arrivals


def prompt(priority: Priority, i: int, args: argparse.Namespace) -> str:
    # Distinct from the first byte on, so no request hits a prefix cache.
    length = args.high_tokens if priority is Priority.HIGH else args.low_tokens
    text = f"{i:05d} {priority.value}: " + "the quick brown fox jumps over the lazy dog " * 100
    return text[:length]


async def run_mode(
    mode: str, arrivals: list[tuple[float, Priority]], args: argparse.Namespace
) -> Outcome:
    degrade = None
    if mode != "plain":
        degrade = DegradeConfig(
            local_prefill=mode == "degrade",
            high_busy_jobs=args.high_busy_jobs,
            sustain_s=args.sustain_s,
            levels=(
                DegradeLevel(pressure=1.0, max_tokens=args.cut_tokens),
                DegradeLevel(pressure=args.reject_pressure, reject=True),
            ),
        )
    backend = HarnessBackend(
        HarnessConfig(
            engine=EngineConfig(
                device=args.device,
                num_blocks=4096,
                scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=4096),
            ),
            prefill_workers=1,
            router=RouterConfig(
                prefill_length_threshold=args.offload_threshold,
                busy_length_threshold=args.offload_threshold,
                max_prefill_queue=64,
            ),
            slo=SloConfig(ttft_ms_low=args.low_ttft_ms),
            degrade=degrade,
        )
    )
    governor = Governor(
        GovernorConfig(max_inflight=64, priority=PriorityPolicy(reserved_for_high=4))
    )
    await backend.start(governor)
    outcome = Outcome(mode)
    try:
        started = time.monotonic()

        async def one(i: int, priority: Priority) -> None:
            high = priority is Priority.HIGH
            max_tokens = args.high_max_tokens if high else args.low_max_tokens
            body = prompt(priority, i, args)
            params = {"max_tokens": max_tokens}
            slot = governor.try_acquire(priority, body=body, params=params)
            if not isinstance(slot, Slot):
                if high:
                    outcome.high_yielded += 1
                else:
                    outcome.low_yielded += 1
                return
            work = Work(id=str(i), body=body, params=params, priority=priority)
            try:
                result = await backend.execute(work, None)
            except Exception:
                outcome.errors += 1
                slot.release("failed")
                return
            slot.release("executed")
            if high:
                outcome.high_ttft.append(result["ttft_ms"])
            else:
                outcome.low_served += 1
                outcome.low_tokens += result["completion_tokens"]
                outcome.low_cut += "degraded" in result

        async with anyio.create_task_group() as tg:
            for i, (at, priority) in enumerate(arrivals):
                delay = started + at - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(one, i, priority)
        decisions = backend.stats().get("router", {}).get("decisions", {})
        outcome.local_for_high = decisions.get("yield_to_high", 0)
    finally:
        await backend.aclose()
    return outcome


def pooled(mode: str, outcomes: list[Outcome]) -> Outcome:
    """Every round's requests together (percentiles over all of them, counts summed)."""
    total = Outcome(mode)
    for o in outcomes:
        total.high_ttft.extend(o.high_ttft)
        total.high_yielded += o.high_yielded
        total.low_served += o.low_served
        total.low_yielded += o.low_yielded
        total.low_cut += o.low_cut
        total.low_tokens += o.low_tokens
        total.local_for_high += o.local_for_high
        total.errors += o.errors
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="a short run (one round of 8 s of arrivals)"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    parser.add_argument("--high-rate", type=float, default=2.0, help="high requests per second")
    parser.add_argument("--low-rate", type=float, default=6.0, help="low requests per second")
    parser.add_argument("--high-tokens", type=int, default=768)
    parser.add_argument("--low-tokens", type=int, default=768)
    parser.add_argument("--high-max-tokens", type=int, default=8)
    parser.add_argument("--low-max-tokens", type=int, default=48)
    parser.add_argument("--cut-tokens", type=int, default=8)
    parser.add_argument(
        "--high-busy-jobs",
        type=int,
        default=1,
        help="high-priority prefills at the worker that keep low ones local",
    )
    parser.add_argument("--sustain-s", type=float, default=0.5)
    parser.add_argument("--reject-pressure", type=float, default=3.0)
    parser.add_argument("--low-ttft-ms", type=float, default=500.0)
    parser.add_argument("--offload-threshold", type=int, default=256)
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="runs of each mode, in alternating order (plain first, then degrade first, ...)",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = 8.0
        args.rounds = 1
    torch.set_num_threads(1)

    arrivals = schedule(args)
    # The machine's speed drifts: alternate the order so that neither mode always runs second.
    runs: dict[str, list[Outcome]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            runs[mode].append(anyio.run(run_mode, mode, arrivals, args))
    outcomes = [pooled(mode, runs[mode]) for mode in MODES]

    highs = sum(1 for _, p in arrivals if p is Priority.HIGH)
    print(
        f"harness degradation, {args.rounds} x {args.duration:.0f} s of arrivals per mode "
        f"(counts are totals over the rounds), each: {highs} high "
        f"({args.high_tokens} tokens in, {args.high_max_tokens} out), "
        f"{len(arrivals) - highs} low ({args.low_tokens} in, {args.low_max_tokens} out); "
        f"torch {torch.__version__}, {platform.machine()}"
    )
    print(
        f"{'mode':<8} {'high TTFT p50':>13} {'p95':>8} {'p99':>8} {'high yld':>8} "
        f"{'low served':>10} {'cut':>5} {'yielded':>7} {'low tokens':>10} {'kept local':>10}"
    )
    rows: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        row = {
            "high_ttft_ms": {
                key: percentile(o.high_ttft, p, default=math.nan)
                for key, p in (("p50", 50), ("p95", 95), ("p99", 99))
            },
            "high_yielded": o.high_yielded,
            "low_served": o.low_served,
            "low_cut": o.low_cut,
            "low_yielded": o.low_yielded,
            "low_tokens": o.low_tokens,
            "kept_local_for_high": o.local_for_high,
            "errors": o.errors,
        }
        rows[o.mode] = row
        t = row["high_ttft_ms"]
        print(
            f"{o.mode:<8} {t['p50']:>13.1f} {t['p95']:>8.1f} {t['p99']:>8.1f} "
            f"{o.high_yielded:>8} {o.low_served:>10} {o.low_cut:>5} {o.low_yielded:>7} "
            f"{o.low_tokens:>10} {o.local_for_high:>10}"
        )
    ratio = rows["degrade"]["high_ttft_ms"]["p99"] / rows["plain"]["high_ttft_ms"]["p99"]
    verdict = "met" if ratio <= GOAL_RATIO else "NOT met"
    print(f"high TTFT p99, degrade / plain: {ratio:.2f} (goal <= {GOAL_RATIO}: {verdict})")
    no_local = rows["no-local"]["high_ttft_ms"]["p99"] / rows["plain"]["high_ttft_ms"]["p99"]
    print(f"high TTFT p99, no-local / plain: {no_local:.2f} (shorter outputs and rejection only)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"args": vars(args), "modes": rows, "ratio_p99": ratio, "no_local_p99": no_local},
                f,
                indent=2,
            )
    return 1 if any(o.errors for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

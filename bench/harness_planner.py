"""Benchmark: goodput under a traffic shift, the planner against a fixed split.

What it measures. The same seeded arrival schedule is replayed against two
harness backends in one run, each starting from the same split (one prefill
worker process, a decode batch of ``--decode-seqs``):

- ``fixed``: the split stays as it is;
- ``planner``: the planner (``HarnessConfig.planner``) watches TTFT and TPOT
  against the objectives and moves capacity: prefill workers started or
  stopped (down to colocated serving), the decode batch and the Governor's
  capacity raised or lowered.

The traffic shifts halfway: first summarisation (``--long-tokens`` prompts,
``--long-max-tokens`` out, at ``--long-rate`` per second), then reasoning
(``--short-tokens`` prompts, ``--short-max-tokens`` out, at
``--short-rate``). Every request asks the Governor first (a yield is not
retried). A request is *good* when it was served with TTFT within
``--ttft-ms`` and TPOT within ``--tpot-ms``; **goodput** is good requests
per second of arrivals. The figure that matters: goodput, planner over
fixed (goal: >= 1.2), with the planner's decisions listed.

The TPOT objective is measured in the same run unless given: the decode
step time of a batch of ``--decode-seqs`` and of a quarter of it (the
engine alone, before the runs), and the objective halfway between them, so
that the fixed split misses it at full batch and a smaller batch meets it
on this machine, whatever its speed.

Run it (from the repository root)::

    .venv/bin/python bench/harness_planner.py
    .venv/bin/python bench/harness_planner.py --quick
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
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.planner import PlannerConfig
from yieldgate.harness.router import RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig, Slot

GOAL_RATIO = 1.2
MODES = ("fixed", "planner")


@dataclass(slots=True)
class Outcome:
    mode: str
    good: list[int] = field(default_factory=lambda: [0, 0])  # per phase
    served: list[int] = field(default_factory=lambda: [0, 0])
    yielded: list[int] = field(default_factory=lambda: [0, 0])
    ttft: list[list[float]] = field(default_factory=lambda: [[], []])
    tpot: list[list[float]] = field(default_factory=lambda: [[], []])
    decisions: list[dict[str, Any]] = field(default_factory=list)
    errors: int = 0


def schedule(args: argparse.Namespace) -> list[tuple[float, int]]:
    """Arrival times and phases (0: long prompts, 1: short prompts), seeded."""
    rng = random.Random(args.seed)
    half = args.duration / 2
    arrivals: list[tuple[float, int]] = []
    for phase, rate in ((0, args.long_rate), (1, args.short_rate)):
        t = phase * half
        while True:
            t += rng.expovariate(rate)
            if t >= (phase + 1) * half:
                break
            arrivals.append((t, phase))
    return arrivals


def prompt(phase: int, i: int, args: argparse.Namespace) -> str:
    length = args.long_tokens if phase == 0 else args.short_tokens
    text = f"{i:05d}: " + "the quick brown fox jumps over the lazy dog " * 100
    return text[:length]


def calibrate_tpot(args: argparse.Namespace) -> tuple[float, float]:
    """Decode step time (ms) at a quarter of ``--decode-seqs`` and at all of it."""
    engine = Engine(EngineConfig(device=args.device, num_blocks=2048))
    times = []
    for batch in (max(1, args.decode_seqs // 4), args.decode_seqs):
        prompts = [list(f"{i:03d} calibration".encode()) for i in range(batch)]
        engine.generate(prompts, SamplingParams(max_tokens=4))  # warm
        seqs = [engine.add(p, SamplingParams(max_tokens=24)) for p in prompts]
        engine.step()  # the prefill
        started = time.perf_counter()
        steps = 0
        while not all(s.is_finished for s in seqs):
            engine.step()
            steps += 1
        times.append((time.perf_counter() - started) * 1000.0 / steps)
    return times[0], times[1]


async def run_mode(
    mode: str, arrivals: list[tuple[float, int]], args: argparse.Namespace
) -> Outcome:
    planner = None
    if mode == "planner":
        planner = PlannerConfig(
            ttft_ms=args.ttft_ms,
            tpot_ms=args.tpot_ms,
            window_s=4.0,
            min_samples=6,
            interval_s=0.25,
            cooldown_s=1.0,
            min_prefill_workers=0,
            max_prefill_workers=args.max_prefill_workers,
            min_decode_seqs=2,
            max_decode_seqs=args.decode_seqs,
            decode_step=max(1, args.decode_seqs // 4),
            long_prompt_tokens=args.offload_threshold,
        )
    backend = HarnessBackend(
        HarnessConfig(
            engine=EngineConfig(
                device=args.device,
                num_blocks=4096,
                scheduler=SchedulerConfig(
                    max_num_seqs=args.decode_seqs, max_num_batched_tokens=4096
                ),
            ),
            prefill_workers=1,
            router=RouterConfig(
                prefill_length_threshold=args.offload_threshold,
                busy_length_threshold=args.offload_threshold,
                max_prefill_queue=64,
            ),
            planner=planner,
            worker_timeout_s=120,
        )
    )
    governor = Governor(GovernorConfig(max_inflight=args.decode_seqs))
    await backend.start(governor)
    outcome = Outcome(mode)
    try:
        started = time.monotonic()

        async def one(i: int, phase: int) -> None:
            max_tokens = args.long_max_tokens if phase == 0 else args.short_max_tokens
            body = prompt(phase, i, args)
            params = {"max_tokens": max_tokens}
            slot = governor.try_acquire(body=body, params=params)
            if not isinstance(slot, Slot):
                outcome.yielded[phase] += 1
                return
            try:
                result = await backend.execute(Work(id=str(i), body=body, params=params), None)
            except Exception:
                outcome.errors += 1
                slot.release("failed")
                return
            slot.release("executed")
            outcome.served[phase] += 1
            outcome.ttft[phase].append(result["ttft_ms"])
            outcome.tpot[phase].append(result["tpot_ms"])
            if result["ttft_ms"] <= args.ttft_ms and result["tpot_ms"] <= args.tpot_ms:
                outcome.good[phase] += 1

        async with anyio.create_task_group() as tg:
            for i, (at, phase) in enumerate(arrivals):
                delay = started + at - time.monotonic()
                if delay > 0:
                    await anyio.sleep(delay)
                tg.start_soon(one, i, phase)
        stats = backend.stats()
        outcome.decisions = [
            {**d, "at": d["at"] - started} for d in stats.get("planner", {}).get("decisions", [])
        ]
    finally:
        await backend.aclose()
    return outcome


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a short run (16 s of arrivals)")
    parser.add_argument("--duration", type=float, default=40.0, help="seconds, both phases")
    parser.add_argument("--long-rate", type=float, default=2.0, help="phase 1 requests/s")
    parser.add_argument("--short-rate", type=float, default=30.0, help="phase 2 requests/s")
    parser.add_argument("--long-tokens", type=int, default=1024)
    parser.add_argument("--long-max-tokens", type=int, default=1)
    parser.add_argument("--short-tokens", type=int, default=32)
    parser.add_argument("--short-max-tokens", type=int, default=64)
    parser.add_argument("--decode-seqs", type=int, default=16)
    parser.add_argument(
        "--max-prefill-workers",
        type=int,
        default=1,
        help="the planner's ceiling (on 2 cores, a second worker's start-up alone hurts)",
    )
    parser.add_argument("--ttft-ms", type=float, default=1000.0)
    parser.add_argument("--tpot-ms", type=float, help="default: calibrated in this run")
    parser.add_argument("--offload-threshold", type=int, default=256)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = 16.0
    torch.set_num_threads(1)
    calibration = None
    if args.tpot_ms is None:
        calibration = calibrate_tpot(args)
        args.tpot_ms = round((calibration[0] + calibration[1]) / 2, 2)

    arrivals = schedule(args)
    outcomes = [anyio.run(run_mode, mode, arrivals, args) for mode in MODES]

    longs = sum(1 for _, phase in arrivals if phase == 0)
    print(
        f"harness planner, {args.duration:.0f} s of arrivals: {longs} long "
        f"({args.long_tokens} tokens in, {args.long_max_tokens} out), then "
        f"{len(arrivals) - longs} short ({args.short_tokens} in, {args.short_max_tokens} out); "
        f"objectives TTFT {args.ttft_ms:.0f} ms, TPOT {args.tpot_ms:.1f} ms"
        + (
            f" (decode step {calibration[0]:.1f} ms at {max(1, args.decode_seqs // 4)}, "
            f"{calibration[1]:.1f} ms at {args.decode_seqs})"
            if calibration
            else ""
        )
        + f"; torch {torch.__version__}, {platform.machine()}"
    )
    print(
        f"{'mode':<8} {'phase':<6} {'served':>6} {'yielded':>7} {'good':>5} "
        f"{'TTFT p99':>9} {'TPOT p50':>9} {'TPOT p99':>9}"
    )
    rows: dict[str, dict[str, Any]] = {}
    for o in outcomes:
        good = sum(o.good)
        rows[o.mode] = {
            "goodput_rps": good / args.duration,
            "good": o.good,
            "served": o.served,
            "yielded": o.yielded,
            "errors": o.errors,
            "decisions": [(d["at"], d["action"], d["target"], d["reason"]) for d in o.decisions],
        }
        for phase, name in ((0, "long"), (1, "short")):
            print(
                f"{o.mode:<8} {name:<6} {o.served[phase]:>6} {o.yielded[phase]:>7} "
                f"{o.good[phase]:>5} {percentile(o.ttft[phase], 99, default=math.nan):>9.1f} "
                f"{percentile(o.tpot[phase], 50, default=math.nan):>9.1f} "
                f"{percentile(o.tpot[phase], 99, default=math.nan):>9.1f}"
            )
    for o in outcomes:
        for d in o.decisions:
            print(
                f"  {o.mode} decision at {d['at']:.1f} s: {d['action']} -> {d['target']} "
                f"({d['reason']}; TTFT p90 {d['ttft_ms']:.0f} ms, TPOT p90 {d['tpot_ms']:.1f} ms)"
            )
    fixed, planned = rows["fixed"]["goodput_rps"], rows["planner"]["goodput_rps"]
    ratio = planned / fixed if fixed else math.inf
    verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
    print(
        f"goodput, planner {planned:.2f}/s / fixed {fixed:.2f}/s: {ratio:.2f} "
        f"(goal >= {GOAL_RATIO}: {verdict})"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "modes": rows, "ratio": ratio}, f, indent=2)
    return 1 if any(o.errors for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())

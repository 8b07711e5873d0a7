"""Benchmark: high-priority TTFT under a low-priority flood, engine priority on against off.

What it measures. One seeded arrival schedule (Poisson: a flood of long
low-priority requests, a trickle of short high-priority ones) is replayed in
wall-clock time against the engine itself, twice per round:

- ``fcfs``: ``SchedulerConfig(priority=False)``: the waiting queue is
  first come, first served, and preemption takes the newest sequence;
- ``priority``: the waiting queue serves high before low (a low request
  that arrived ``--age-bound`` steps ago goes as if high), and preemption
  takes low first.

The flood is larger than the engine serves (``--max-num-seqs`` running, the
rest waiting), so a queue of low requests builds up; that queue is what a
high-priority request waits behind without priority. The engine is driven
directly (no server, no Governor, no prefill workers): admission control
would keep the queue short, and the point here is the engine's own order.
Arrivals stop after ``--duration`` seconds; the engine then runs on for at
most ``--drain`` seconds, and what is unserved by then counts as not served.

Columns, per mode (medians over the rounds, and the spread: min to max):
high TTFT p50, p95, p99; high goodput (served within ``--high-ttft-ms``, per
offered high request); low TTFT p50 and p99 (of those served); low served;
low goodput (within ``--low-ttft-ms``, per offered low request);
preemptions; aged (low requests served as if high, the age bound having
passed); tokens generated per second. The ratio printed is high TTFT p99,
priority over fcfs (median of the rounds' ratios, each round's pair measured
back to back). Rounds alternate which mode runs first.

Run it (from the repository root)::

    .venv/bin/python bench/harness_priority.py
    .venv/bin/python bench/harness_priority.py --quick
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams
from yieldgate.harness.sequence import Sequence as Seq
from yieldgate.protocol import Priority

MODES = ("fcfs", "priority")


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    priority: Priority
    prompt: list[int]
    max_tokens: int


@dataclass(slots=True)
class Outcome:
    mode: str
    high_ttft: list[float] = field(default_factory=list)
    low_ttft: list[float] = field(default_factory=list)
    high_offered: int = 0
    low_offered: int = 0
    preemptions: int = 0
    aged: int = 0  # low requests served as if high (the age bound)
    tokens: int = 0
    seconds: float = 0.0


def trace(args: argparse.Namespace) -> list[Arrival]:
    """The arrivals, from one seeded generator: the same for both modes and every round."""
    rng = random.Random(args.seed)
    arrivals: list[Arrival] = []
    kinds = (
        (Priority.HIGH, args.high_rate, args.high_tokens, args.high_max_tokens),
        (Priority.LOW, args.low_rate, args.low_tokens, args.low_max_tokens),
    )
    for priority, rate, length, max_tokens in kinds:
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= args.duration:
                break
            # Random bytes: no two prompts share a prefix-cache block.
            prompt = [rng.randrange(256) for _ in range(length)]
            arrivals.append(Arrival(t, priority, prompt, max_tokens))
    arrivals.sort(key=lambda a: a.at)
    return arrivals


def run_mode(mode: str, arrivals: list[Arrival], engine: Engine, drain_s: float) -> Outcome:
    """Replay ``arrivals`` in wall-clock time through ``engine``; TTFT in ms per priority."""
    engine.scheduler.config = replace(engine.scheduler.config, priority=mode == "priority")
    engine.reset_counters()
    outcome = Outcome(mode)
    pending = list(arrivals)
    arrived: dict[int, tuple[float, Priority]] = {}
    live: list[Seq] = []
    started = time.monotonic()
    deadline = started + arrivals[-1].at + drain_s
    while time.monotonic() < deadline:
        now = time.monotonic() - started
        while pending and pending[0].at <= now:
            a = pending.pop(0)
            seq = engine.add(a.prompt, SamplingParams(max_tokens=a.max_tokens), a.priority)
            arrived[seq.id] = (started + a.at, a.priority)
            live.append(seq)
        if not pending and not engine.has_work:
            break
        result = engine.step()
        if result is None:
            if pending:
                time.sleep(max(0.0, min(0.005, started + pending[0].at - time.monotonic())))
            continue
        done_at = time.monotonic()
        if result.is_prefill:
            for seq in result.seqs:
                if seq.num_output == 1:  # its first token (a recompute has more)
                    at, priority = arrived[seq.id]
                    age = engine.scheduler.clock - 1 - seq.arrival_step
                    bound = engine.scheduler.config.priority_age_bound
                    outcome.aged += mode == "priority" and seq.rank > 0 and age >= bound
                    ttft = (done_at - at) * 1000.0
                    (outcome.high_ttft if priority is Priority.HIGH else outcome.low_ttft).append(
                        ttft
                    )
    for seq in live:  # the drain ran out: unserved, and their blocks go back
        engine.abort(seq)
    outcome.seconds = time.monotonic() - started
    outcome.high_offered = sum(1 for a in arrivals if a.priority is Priority.HIGH)
    outcome.low_offered = len(arrivals) - outcome.high_offered
    outcome.preemptions = engine.scheduler.num_preemptions
    outcome.tokens = engine.tokens_generated
    return outcome


def summary(o: Outcome, args: argparse.Namespace) -> dict[str, float]:
    """One round's columns for one mode."""
    high_ok = sum(1 for t in o.high_ttft if t <= args.high_ttft_ms)
    low_ok = sum(1 for t in o.low_ttft if t <= args.low_ttft_ms)
    return {
        "high_p50": percentile(o.high_ttft, 50, default=math.nan),
        "high_p95": percentile(o.high_ttft, 95, default=math.nan),
        "high_p99": percentile(o.high_ttft, 99, default=math.nan),
        "high_served": len(o.high_ttft),
        "high_goodput": high_ok / o.high_offered if o.high_offered else math.nan,
        "low_p50": percentile(o.low_ttft, 50, default=math.nan),
        "low_p99": percentile(o.low_ttft, 99, default=math.nan),
        "low_served": len(o.low_ttft),
        "low_goodput": low_ok / o.low_offered if o.low_offered else math.nan,
        "preemptions": o.preemptions,
        "aged": o.aged,
        "tokens_per_s": o.tokens / o.seconds if o.seconds else math.nan,
    }


COLUMNS = (
    ("high_p50", "high TTFT p50", "{:.0f}"),
    ("high_p95", "p95", "{:.0f}"),
    ("high_p99", "p99", "{:.0f}"),
    ("high_goodput", "high goodput", "{:.2f}"),
    ("low_p50", "low TTFT p50", "{:.0f}"),
    ("low_p99", "p99", "{:.0f}"),
    ("low_served", "low served", "{:.0f}"),
    ("low_goodput", "low goodput", "{:.2f}"),
    ("preemptions", "preempt", "{:.0f}"),
    ("aged", "aged", "{:.0f}"),
    ("tokens_per_s", "tok/s", "{:.0f}"),
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="one short round")
    parser.add_argument("--duration", type=float, default=12.0, help="seconds of arrivals")
    parser.add_argument("--drain", type=float, default=8.0, help="seconds to run on after them")
    parser.add_argument("--high-rate", type=float, default=3.0, help="high requests per second")
    parser.add_argument("--low-rate", type=float, default=24.0, help="low requests per second")
    parser.add_argument("--high-tokens", type=int, default=64, help="high prompt length")
    parser.add_argument("--low-tokens", type=int, default=256, help="low prompt length")
    parser.add_argument("--high-max-tokens", type=int, default=8)
    parser.add_argument("--low-max-tokens", type=int, default=48)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="the engine's batch")
    parser.add_argument("--kv-blocks", type=int, default=256, help="KV blocks of 16 tokens")
    parser.add_argument("--age-bound", type=int, default=None, help="steps (engine default)")
    parser.add_argument("--high-ttft-ms", type=float, default=500.0, help="high objective")
    parser.add_argument("--low-ttft-ms", type=float, default=5000.0, help="low objective")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, the order alternated")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.drain, args.rounds = 5.0, 5.0, 1
    if smoke(args):
        args.duration, args.drain, args.rounds = 1.0, 1.0, 1
    torch.set_num_threads(1)

    arrivals = trace(args)
    sched = SchedulerConfig(max_num_seqs=args.max_num_seqs)
    if args.age_bound is not None:
        sched = SchedulerConfig(max_num_seqs=args.max_num_seqs, priority_age_bound=args.age_bound)
    engine = Engine(EngineConfig(device=args.device, num_blocks=args.kv_blocks, scheduler=sched))
    engine.generate([arrivals[0].prompt], SamplingParams(max_tokens=4))  # warm-up
    rounds: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            rounds[mode].append(summary(run_mode(mode, arrivals, engine, args.drain), args))

    highs = sum(1 for a in arrivals if a.priority is Priority.HIGH)
    print(
        f"harness priority, {args.rounds} round(s) of {args.duration:.0f} s of arrivals "
        f"(+ up to {args.drain:.0f} s to drain) per mode: {highs} high ({args.high_tokens} "
        f"tokens in, {args.high_max_tokens} out), {len(arrivals) - highs} low "
        f"({args.low_tokens} in, {args.low_max_tokens} out); max_num_seqs "
        f"{args.max_num_seqs}, age bound {sched.priority_age_bound} steps; torch "
        f"{torch.__version__}, {platform.machine()}"
    )
    print("medians over the rounds, [min..max] below; TTFT in ms")
    print(f"{'mode':<9}" + "".join(f"{label:>14}" for _, label, _ in COLUMNS))
    table: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        cells, spreads, row = [], [], {}
        for key, _, fmt in COLUMNS:
            values = [r[key] for r in rounds[mode]]
            med = statistics.median(values)
            row[key] = {"median": med, "min": min(values), "max": max(values)}
            cells.append(f"{fmt.format(med):>14}")
            spreads.append(f"{fmt.format(min(values)) + '..' + fmt.format(max(values)):>14}")
        table[mode] = row
        print(f"{mode:<9}" + "".join(cells))
        print(f"{'':<9}" + "".join(spreads))
    ratios = [
        p["high_p99"] / f["high_p99"]
        for p, f in zip(rounds["priority"], rounds["fcfs"], strict=True)
    ]
    ratio = statistics.median(ratios)
    print(
        f"high TTFT p99, priority / fcfs: {ratio:.3f} "
        f"(median of {len(ratios)} rounds, {min(ratios):.3f}..{max(ratios):.3f})"
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(
                {"args": vars(args), "modes": table, "ratios_p99": ratios, "ratio_p99": ratio},
                f,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

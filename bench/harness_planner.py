"""Benchmark: goodput under a traffic shift, the planner against the best fixed split.

What it measures. One seeded arrival schedule is replayed against harness
backends in one run. The traffic alternates ``--cycles`` times between two
phases: **summarise** (``--long-tokens`` prompts, ``--long-max-tokens`` out,
at ``--long-rate`` per second for ``--long-seconds``), then **reason**
(``--short-tokens`` prompts, ``--short-max-tokens`` out, at ``--short-rate``
for ``--short-seconds``). Every request asks the Governor first
(``try_acquire``, as a front does); a yield is not retried.

1. **The sweep.** Every fixed split the planner could move between is run
   once on the whole schedule: ``--sweep-prefill`` prefill worker processes
   (0: colocated serving) times ``--sweep-decode`` decode batches (the
   engine's ``max_num_seqs`` and the Governor's capacity). Each phase's
   goodput is read from that run, so the sweep names the best split **per
   phase** (the trace is only a traffic shift if they differ) and the
   **best fixed** split over the whole trace (ties: the first listed).
2. **The rounds.** The planner (``HarnessConfig.planner``, starting from
   ``--max-prefill-workers`` workers and a decode batch of ``--decode-seqs``,
   allowed 0 to that many workers and a decode batch of 2 to
   ``--decode-seqs``) and the best fixed split run ``--rounds`` times, the
   order alternated (fixed first in even rounds); each figure is the median
   over the rounds, with the spread (min-max) beside it.

**Goodput** is the share of the requests *offered* (every arrival) that were
served with TTFT within the TTFT objective and TPOT within the TPOT
objective: a yield, an error or a late request counts as not served. The
tails (TTFT and TPOT p50 and p99 of the served requests), the served, yield
and error counts are printed for every run. The figure that matters:
goodput, planner over best fixed, median of the rounds' ratios (goal >= 1.1),
overall and per phase.

**The objectives**, by a rule that favours neither side: ``--slo-scale``
times the unloaded figures measured in this run before anything else, on
the engine alone with one request at a time (median of five): TTFT
objective = scale x the TTFT of one ``--long-tokens`` prompt, TPOT objective =
scale x the decode step time of one stream. ``--ttft-ms`` and ``--tpot-ms``
override them.

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
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.planner import PlannerConfig
from yieldgate.harness.router import RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig, Slot

GOAL_RATIO = 1.1
PHASES = ("summ", "reason", "all")
COLUMNS = ("goodput", "served", "yields", "errors", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")


@dataclass(frozen=True, slots=True)
class Setup:
    """A fixed split (prefill workers, decode batch) or the planner."""

    prefill_workers: int
    decode_seqs: int
    planner: bool = False

    @property
    def name(self) -> str:
        if self.planner:
            return "planner"
        return f"fixed p{self.prefill_workers} d{self.decode_seqs}"


@dataclass(slots=True)
class Outcome:
    setup: Setup
    offered: list[int] = field(default_factory=lambda: [0, 0])  # per phase
    good: list[int] = field(default_factory=lambda: [0, 0])
    served: list[int] = field(default_factory=lambda: [0, 0])
    yielded: list[int] = field(default_factory=lambda: [0, 0])
    errors: list[int] = field(default_factory=lambda: [0, 0])
    ttft: list[list[float]] = field(default_factory=lambda: [[], []])
    tpot: list[list[float]] = field(default_factory=lambda: [[], []])
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def row(self, phase: int | None) -> dict[str, float]:
        """The columns for one phase (``None``: both together)."""
        phases = (0, 1) if phase is None else (phase,)
        ttft = [t for p in phases for t in self.ttft[p]]
        tpot = [t for p in phases for t in self.tpot[p]]
        offered = sum(self.offered[p] for p in phases)
        return {
            "goodput": sum(self.good[p] for p in phases) / offered if offered else math.nan,
            "served": sum(self.served[p] for p in phases),
            "yields": sum(self.yielded[p] for p in phases),
            "errors": sum(self.errors[p] for p in phases),
            "ttft_p50": percentile(ttft, 50, default=math.nan),
            "ttft_p99": percentile(ttft, 99, default=math.nan),
            "tpot_p50": percentile(tpot, 50, default=math.nan),
            "tpot_p99": percentile(tpot, 99, default=math.nan),
        }


def segments(args: argparse.Namespace) -> list[tuple[float, float, int]]:
    """The phases in order: (start s, end s, kind), kind 0 summarise, 1 reason."""
    out: list[tuple[float, float, int]] = []
    t = 0.0
    for _ in range(args.cycles):
        for kind, seconds in ((0, args.long_seconds), (1, args.short_seconds)):
            out.append((t, t + seconds, kind))
            t += seconds
    return out


def schedule(args: argparse.Namespace) -> list[tuple[float, int]]:
    """Arrival times and phases (0: summarise, 1: reason), seeded."""
    rng = random.Random(args.seed)
    arrivals: list[tuple[float, int]] = []
    for start, end, kind in segments(args):
        rate = args.long_rate if kind == 0 else args.short_rate
        t = start
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            arrivals.append((t, kind))
    return arrivals


def prompt(phase: int, i: int, args: argparse.Namespace) -> str:
    length = args.long_tokens if phase == 0 else args.short_tokens
    text = f"{i:05d}: " + "the quick brown fox jumps over the lazy dog " * 100
    return text[:length]


def unloaded(args: argparse.Namespace) -> tuple[float, float]:
    """TTFT of one long prompt and the decode step of one stream, unloaded (ms, median of 5)."""
    engine = Engine(EngineConfig(device=args.device, num_blocks=2048))
    engine.generate([list(b"warm-up")], SamplingParams(max_tokens=4))
    ttfts, steps = [], []
    for i in range(5):
        seq = engine.add(list(prompt(0, i, args).encode()), SamplingParams(max_tokens=1))
        started = time.perf_counter()
        while seq.num_output < 1:
            engine.step()
        ttfts.append((time.perf_counter() - started) * 1000.0)
        seq = engine.add(list(prompt(1, i, args).encode()), SamplingParams(max_tokens=17))
        while seq.num_output < 1:
            engine.step()
        started = time.perf_counter()
        while not seq.is_finished:
            engine.step()
        steps.append((time.perf_counter() - started) * 1000.0 / 16)
    return percentile(ttfts, 50), percentile(steps, 50)


async def run_setup(
    setup: Setup, arrivals: list[tuple[float, int]], args: argparse.Namespace
) -> Outcome:
    planner = None
    if setup.planner:
        planner = PlannerConfig(
            ttft_ms=args.ttft_ms,
            tpot_ms=args.tpot_ms,
            window_s=3.0,
            min_samples=6,
            interval_s=0.25,
            cooldown_s=0.75,
            min_prefill_workers=0,
            max_prefill_workers=args.max_prefill_workers,
            min_decode_seqs=2,
            max_decode_seqs=args.decode_seqs,
            decode_step=max(1, args.decode_seqs // 8),
            headroom=args.headroom,
            long_prompt_tokens=args.offload_threshold,
            stop_idle_workers=args.stop_idle_workers,
            ttft_bounds_batch=args.ttft_bounds_batch,
        )
    backend = HarnessBackend(
        HarnessConfig(
            engine=EngineConfig(
                device=args.device,
                num_blocks=4096,
                scheduler=SchedulerConfig(
                    max_num_seqs=setup.decode_seqs, max_num_batched_tokens=4096
                ),
            ),
            prefill_workers=setup.prefill_workers,
            router=RouterConfig(
                prefill_length_threshold=args.offload_threshold,
                busy_length_threshold=args.offload_threshold,
                max_prefill_queue=args.max_prefill_queue,
            ),
            planner=planner,
            worker_timeout_s=120,
        )
    )
    governor = Governor(GovernorConfig(max_inflight=setup.decode_seqs))
    await backend.start(governor)
    outcome = Outcome(setup)
    try:
        started = time.monotonic()

        async def one(i: int, phase: int) -> None:
            outcome.offered[phase] += 1
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
                outcome.errors[phase] += 1
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


def _cell(column: str, value: float) -> str:
    if column == "goodput":
        return f"{value:.3f}"
    if column.startswith(("ttft", "tpot")):
        return f"{value:.1f}"
    return f"{value:.0f}"


def print_table(title: str, rows: list[tuple[str, str, dict[str, str]]]) -> None:
    print(title)
    widths = {c: max(len(c), *(len(r[2][c]) for r in rows)) for c in COLUMNS}
    print(f"{'setup':<16} {'phase':<5} " + " ".join(f"{c:>{widths[c]}}" for c in COLUMNS))
    for name, phase, cells in rows:
        print(f"{name:<16} {phase:<5} " + " ".join(f"{cells[c]:>{widths[c]}}" for c in COLUMNS))


def summary(outcomes: list[Outcome]) -> dict[str, dict[str, list[float]]]:
    """Per phase and column, the values of every run in ``outcomes``."""
    return {
        name: {c: [o.row(phase)[c] for o in outcomes] for c in COLUMNS}
        for name, phase in zip(PHASES, (0, 1, None), strict=True)
    }


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"expected integers >= 0, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 6 s per phase, one round, decode batch 16 only in the sweep",
    )
    parser.add_argument("--cycles", type=int, default=1, help="summarise then reason, N times")
    parser.add_argument("--rounds", type=int, default=3, help="planner against best fixed")
    parser.add_argument("--long-seconds", type=float, default=20.0, help="summarise phase")
    parser.add_argument("--short-seconds", type=float, default=8.0, help="reason phase")
    parser.add_argument("--long-rate", type=float, default=4.0, help="summarise requests/s")
    parser.add_argument("--short-rate", type=float, default=16.0, help="reason requests/s")
    parser.add_argument("--long-tokens", type=int, default=1024)
    parser.add_argument("--long-max-tokens", type=int, default=1)
    parser.add_argument("--short-tokens", type=int, default=32)
    parser.add_argument("--short-max-tokens", type=int, default=64)
    parser.add_argument("--decode-seqs", type=int, default=16, help="the planner's start and max")
    parser.add_argument(
        "--max-prefill-workers",
        type=int,
        default=0,
        help="the planner's ceiling and start (issue 42: a worker lost or tied every cell)",
    )
    parser.add_argument(
        "--sweep-prefill", type=_ints, default=None, help="default: 0 to --max-prefill-workers"
    )
    parser.add_argument("--sweep-decode", type=_ints, default=[16, 8, 4])
    parser.add_argument("--slo-scale", type=float, default=4.0, help="x the unloaded figures")
    parser.add_argument("--ttft-ms", type=float, help="default: measured in this run")
    parser.add_argument("--tpot-ms", type=float, help="default: measured in this run")
    parser.add_argument("--offload-threshold", type=int, default=256)
    parser.add_argument(
        "--max-prefill-queue",
        type=int,
        default=1,
        help="router: past this many queued at every worker, a prompt is prefilled locally",
    )
    parser.add_argument("--headroom", type=float, default=0.6, help="the planner's headroom")
    parser.add_argument(
        "--stop-idle-workers",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="the planner may stop prefill workers (off: an idle worker costs no CPU here)",
    )
    parser.add_argument(
        "--ttft-bounds-batch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the planner lowers the decode batch when the TTFT misses and prefill cannot grow",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.long_seconds = args.short_seconds = 6.0
        args.rounds, args.sweep_decode = 1, [args.decode_seqs]
    if smoke(args):  # --quick with 1 s per phase and no prefill worker in the sweep
        args.long_seconds = args.short_seconds = 1.0
        args.rounds, args.sweep_decode, args.cycles = 1, [args.decode_seqs], 1
        args.sweep_prefill, args.long_tokens, args.long_rate = [0], 256, 2.0
    if args.cycles < 1:
        raise ValueError(f"--cycles must be >= 1, got {args.cycles}")
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    if args.slo_scale <= 0:
        raise ValueError(f"--slo-scale must be > 0, got {args.slo_scale}")
    if 0 in args.sweep_decode:
        raise ValueError("--sweep-decode: a decode batch must be >= 1")
    sweep_prefill = args.sweep_prefill or list(range(args.max_prefill_workers + 1))
    torch.set_num_threads(1)
    base = unloaded(args)
    if args.ttft_ms is None:
        args.ttft_ms = round(args.slo_scale * base[0], 1)
    if args.tpot_ms is None:
        args.tpot_ms = round(args.slo_scale * base[1], 2)

    arrivals = schedule(args)
    longs = sum(1 for _, phase in arrivals if phase == 0)
    print(
        f"harness planner, {args.cycles} x ({args.long_seconds:g} s summarise: "
        f"{args.long_tokens} tokens in, {args.long_max_tokens} out at {args.long_rate:g}/s; "
        f"then {args.short_seconds:g} s reason: {args.short_tokens} in, "
        f"{args.short_max_tokens} out at {args.short_rate:g}/s): {longs} + "
        f"{len(arrivals) - longs} requests; torch {torch.__version__}, {platform.machine()}"
    )
    print(
        f"objectives: TTFT {args.ttft_ms:.1f} ms, TPOT {args.tpot_ms:.2f} ms "
        f"({args.slo_scale:g} x unloaded, measured now: TTFT of one {args.long_tokens}-token "
        f"prompt {base[0]:.1f} ms, one stream's decode step {base[1]:.2f} ms, "
        "unless given); goodput = good / offered"
    )

    sweep = [
        anyio.run(run_setup, Setup(p, d), arrivals, args)
        for p in sweep_prefill
        for d in args.sweep_decode
    ]
    best = max(sweep, key=lambda o: o.row(None)["goodput"])  # the first of equals
    print_table(
        "the sweep, one run each:",
        [
            (o.setup.name, name, {c: _cell(c, o.row(phase)[c]) for c in COLUMNS})
            for o in sweep
            for name, phase in zip(PHASES, (0, 1, None), strict=True)
        ],
    )
    per_phase = [max(sweep, key=lambda o, k=k: o.row(k)["goodput"]) for k in (0, 1)]
    for k, o in enumerate(per_phase):
        print(
            f"best split in phase {PHASES[k]}: {o.setup.name} (goodput {o.row(k)['goodput']:.3f})"
        )
    if per_phase[0].setup == per_phase[1].setup:
        print("  (the same split is best in both phases: no traffic shift for a planner to use)")
    print(f"best fixed split: {best.setup.name} (goodput {best.row(None)['goodput']:.3f})")
    # The most any planner could get from this sweep: each phase's best split, switched free.
    oracle = sum(o.good[k] for k, o in enumerate(per_phase)) / max(1, sum(best.offered))
    best_goodput = best.row(None)["goodput"]
    print(
        f"an oracle planner (each phase's best split, switched at no cost): goodput {oracle:.3f}, "
        f"{oracle / best_goodput if best_goodput else math.nan:.2f} x the best fixed split"
    )

    setups = (best.setup, Setup(args.max_prefill_workers, args.decode_seqs, planner=True))
    runs: dict[bool, list[Outcome]] = {False: [], True: []}
    for round_ in range(args.rounds):
        for setup in setups if round_ % 2 == 0 else setups[::-1]:
            runs[setup.planner].append(anyio.run(run_setup, setup, arrivals, args))
    tables = {planned: summary(runs[planned]) for planned in (False, True)}
    rows_med, rows_spread = [], []
    for planned in (False, True):
        name = setups[planned].name
        for phase in PHASES:
            values = tables[planned][phase]
            rows_med.append(
                (name, phase, {c: _cell(c, percentile(values[c], 50)) for c in COLUMNS})
            )
            rows_spread.append(
                (
                    name,
                    phase,
                    {c: f"{_cell(c, min(values[c]))}-{_cell(c, max(values[c]))}" for c in COLUMNS},
                )
            )
    print_table(f"planner against best fixed, {args.rounds} rounds, medians:", rows_med)
    print_table("spread over the rounds (min-max):", rows_spread)
    for i, o in enumerate(runs[True]):
        counts = Counter(f"{d['action']} ({d['reason']})" for d in o.decisions)
        print(f"  planner round {i + 1}: {len(o.decisions)} decisions: {dict(counts)}")
    for d in runs[True][-1].decisions:
        print(
            f"    last round, at {d['at']:.1f} s: {d['action']} -> {d['target']} "
            f"({d['reason']}; TTFT p90 {d['ttft_ms']:.0f} ms, TPOT p90 {d['tpot_ms']:.1f} ms)"
        )
    ratios = [
        p.row(None)["goodput"] / f.row(None)["goodput"] if f.row(None)["goodput"] else math.nan
        for f, p in zip(runs[False], runs[True], strict=True)
    ]
    ratio = percentile(ratios, 50)
    verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
    for k in (0, 1):
        phase_ratios = [
            p.row(k)["goodput"] / f.row(k)["goodput"] if f.row(k)["goodput"] else math.nan
            for f, p in zip(runs[False], runs[True], strict=True)
        ]
        print(
            f"  phase {PHASES[k]}: planner / best fixed {percentile(phase_ratios, 50):.2f} "
            f"(rounds {min(phase_ratios):.2f}-{max(phase_ratios):.2f})"
        )
    print(
        f"goodput, planner / best fixed ({best.setup.name}): {ratio:.2f} "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f}; goal >= {GOAL_RATIO}: {verdict})"
    )
    if args.json:
        payload = {
            "args": vars(args),
            "unloaded_ms": {"ttft": base[0], "tpot": base[1]},
            "sweep": {
                o.setup.name: {n: o.row(p) for n, p in zip(PHASES, (0, 1, None), strict=True)}
                for o in sweep
            },
            "best_fixed": best.setup.name,
            "best_per_phase": [o.setup.name for o in per_phase],
            "oracle_goodput": oracle,
            "rounds": {setups[k].name: tables[k] for k in (False, True)},
            "decisions": [
                [(d["at"], d["action"], d["target"], d["reason"]) for d in o.decisions]
                for o in runs[True]
            ],
            "ratios": ratios,
            "ratio": ratio,
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 1 if any(sum(o.errors) for rs in runs.values() for o in rs) else 0


if __name__ == "__main__":
    sys.exit(main())

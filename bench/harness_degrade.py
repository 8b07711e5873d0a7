"""Benchmark: high-priority TTFT during a low-priority flood: degradation, early rejection, both.

What it measures. The same seeded arrival schedule is replayed against
harness backends (one prefill worker process each) in one run, in the arms
``--modes`` names (default ``qos,degrade,degrade+qos``) of these seven:

- ``plain``: no admission control at all: the flood's long prompts queue at
  the prefill worker with the high-priority ones, and its long outputs fill
  the decode batch;
- ``qos``: the project's SLO early rejection (``HarnessConfig.qos``): a
  request whose estimated TTFT misses its priority's objective is refused at
  once (``yield``); the high priority has no objective, so it is never
  refused. This is the baseline degradation has to beat;
- ``degrade``: graceful degradation (``HarnessConfig.degrade``): while the
  worker holds ``--high-busy-jobs`` high-priority prefills, low-priority
  prompts are prefilled on the decode worker; when the QoS estimate stays
  above the low objective for ``--sustain-s``, low-priority outputs are cut
  to ``--cut-tokens``, and above ``--reject-pressure`` times the objective
  they are refused (``yield``);
- ``no-local``: the same without the local prefill (shorter outputs and
  rejection only), to tell the two forms' effects apart;
- ``degrade+qos``: both (``qos`` and ``degrade`` set): degradation as above,
  and a low request is also held to early rejection's rule, its TTFT
  estimate taken on the queue of the route it will take (the decode
  worker's alone while a high prefill keeps it local). Issue 42's goal: a
  high TTFT p99 no worse than ``qos``'s and a better goodput over both
  priorities, at both loads;
- ``qos+cut``: ``degrade+qos`` without the local prefill: early rejection's
  admissions exactly, and the outputs cut under sustained overload;
- ``degrade+qos-whole``: ``degrade+qos`` with each local prompt prefilled in one
  step. The arms with a local prefill compute it ``--prefill-chunk`` tokens a
  step (``SchedulerConfig.prefill_chunk``, default 64), a decode step between
  two pieces; this one does not, to show what the chunks are worth.

High-priority requests (``--high-tokens`` bytes in, ``--high-max-tokens``
out) arrive as a Poisson process at ``--high-rate`` per second; the flood
(``--low-tokens`` in, ``--low-max-tokens`` out) at each of ``--low-rates``
(one load each; the lighter one is where degradation may cost more than it
gives). Every request asks the Governor first (``try_acquire``, as a front
does, with the backend's admission hook), and a yielded one is not retried.

**Goodput**, per priority, is the share of the requests *offered* that were
served in full within the TTFT objective (``--high-ttft-ms``, used for
counting only; ``--low-ttft-ms``, also the low objective the arms act on);
a yield, an error or a cut output counts as not served (``*_good``). The
``*_ok`` columns count a cut output served within the objective as served
(degraded service is service; the strict figure is the headline). The
figures that matter: high-priority TTFT p99 and all-priority goodput,
degrade+qos over qos, at each load. The machine's speed drifts (it is
shared), so each load runs ``--rounds`` rounds of the arms, the order
reversed every other round; every figure is the median over the rounds, the
spread (min-max) beside it, and each ratio's spread over the rounds too.

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

from _common import add_smoke_flag, smoke
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

MODES = ("plain", "qos", "degrade", "no-local", "degrade+qos", "qos+cut", "degrade+qos-whole")
DEFAULT_MODES = ("qos", "degrade", "degrade+qos")
COLUMNS = (
    "high_p50",
    "high_p95",
    "high_p99",
    "high_good",
    "high_yld",
    "low_p99",
    "low_good",
    "low_served",
    "low_cut",
    "low_yld",
    "low_tokens",
    "low_ok",
    "all_good",
    "all_ok",
    "kept_local",
    "errors",
)


@dataclass(slots=True)
class Outcome:
    mode: str
    high_offered: int = 0
    high_ttft: list[float] = field(default_factory=list)
    high_good: int = 0
    high_yielded: int = 0
    low_offered: int = 0
    low_ttft: list[float] = field(default_factory=list)
    low_good: int = 0
    low_ok: int = 0
    low_served: int = 0
    low_yielded: int = 0
    low_cut: int = 0
    low_tokens: int = 0
    local_for_high: int = 0
    errors: int = 0

    def row(self) -> dict[str, float]:
        """The printed columns of this run."""
        offered = self.high_offered + self.low_offered
        return {
            "high_p50": percentile(self.high_ttft, 50, default=math.nan),
            "high_p95": percentile(self.high_ttft, 95, default=math.nan),
            "high_p99": percentile(self.high_ttft, 99, default=math.nan),
            "high_good": self.high_good / self.high_offered if self.high_offered else math.nan,
            "high_yld": self.high_yielded,
            "low_p99": percentile(self.low_ttft, 99, default=math.nan),
            "low_good": self.low_good / self.low_offered if self.low_offered else math.nan,
            "low_served": self.low_served,
            "low_cut": self.low_cut,
            "low_yld": self.low_yielded,
            "low_tokens": self.low_tokens,
            "low_ok": self.low_ok / self.low_offered if self.low_offered else math.nan,
            "all_good": (self.high_good + self.low_good) / offered if offered else math.nan,
            "all_ok": (self.high_good + self.low_ok) / offered if offered else math.nan,
            "kept_local": self.local_for_high,
            "errors": self.errors,
        }


def schedule(args: argparse.Namespace, low_rate: float) -> list[tuple[float, Priority]]:
    """Arrival times and priorities, from one seeded generator (the same for every mode)."""
    rng = random.Random(args.seed)
    arrivals: list[tuple[float, Priority]] = []
    for priority, rate in ((Priority.HIGH, args.high_rate), (Priority.LOW, low_rate)):
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
    if mode in ("degrade", "no-local", "degrade+qos", "qos+cut", "degrade+qos-whole"):
        degrade = DegradeConfig(
            local_prefill=mode not in ("no-local", "qos+cut"),
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
                scheduler=SchedulerConfig(
                    max_num_seqs=64,
                    max_num_batched_tokens=4096,
                    prefill_chunk=(
                        args.prefill_chunk
                        if degrade and degrade.local_prefill and not mode.endswith("-whole")
                        else 0
                    ),
                ),
            ),
            prefill_workers=1,
            router=RouterConfig(
                prefill_length_threshold=args.offload_threshold,
                busy_length_threshold=args.offload_threshold,
                max_prefill_queue=64,
            ),
            slo=SloConfig(ttft_ms_low=args.low_ttft_ms),
            qos=mode in ("qos", "degrade+qos", "qos+cut", "degrade+qos-whole"),
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
            if high:
                outcome.high_offered += 1
            else:
                outcome.low_offered += 1
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
            ttft = result["ttft_ms"]
            cut = "degraded" in result
            if high:
                outcome.high_ttft.append(ttft)
                outcome.high_good += ttft <= args.high_ttft_ms and not cut
            else:
                outcome.low_ttft.append(ttft)
                outcome.low_served += 1
                outcome.low_tokens += result["completion_tokens"]
                outcome.low_cut += cut
                outcome.low_good += ttft <= args.low_ttft_ms and not cut
                outcome.low_ok += ttft <= args.low_ttft_ms

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


def _cell(column: str, value: float) -> str:
    if column.endswith(("_good", "_ok")):
        return f"{value:.2f}"
    return f"{value:,.0f}"


def print_table(title: str, rows: list[tuple[str, dict[str, str]]]) -> None:
    print(title)
    widths = {c: max(len(c), *(len(cells[c]) for _, cells in rows)) for c in COLUMNS}
    first = max(len("mode"), *(len(mode) for mode, _ in rows))
    print(f"{'mode':<{first}} " + " ".join(f"{c:>{widths[c]}}" for c in COLUMNS))
    for mode, cells in rows:
        print(f"{mode:<{first}} " + " ".join(f"{cells[c]:>{widths[c]}}" for c in COLUMNS))


RATIOS = (
    ("degrade+qos", "qos"),
    ("degrade+qos", "degrade"),
    ("qos+cut", "qos"),
    ("degrade+qos-whole", "qos"),
    ("degrade+qos", "degrade+qos-whole"),
    ("degrade", "qos"),
    ("no-local", "qos"),
    ("qos", "plain"),
)


def run_load(low_rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """Every round of the arms at one flood rate; prints the tables, returns the figures."""
    modes: tuple[str, ...] = args.modes
    arrivals = schedule(args, low_rate)
    # The machine's speed drifts: reverse the order every other round.
    runs: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            runs[mode].append(anyio.run(run_mode, mode, arrivals, args).row())
    values = {mode: {c: [r[c] for r in runs[mode]] for c in COLUMNS} for mode in modes}
    medians = {mode: {c: percentile(values[mode][c], 50) for c in COLUMNS} for mode in modes}
    highs = sum(1 for _, p in arrivals if p is Priority.HIGH)
    print(
        f"flood at {low_rate:g}/s: {args.rounds} rounds x {args.duration:.0f} s of arrivals per "
        f"mode, each: {highs} high ({args.high_tokens} tokens in, {args.high_max_tokens} out), "
        f"{len(arrivals) - highs} low ({args.low_tokens} in, {args.low_max_tokens} out)"
    )
    print_table(
        "medians (TTFT in ms; *_good: served in full within the objective / offered;"
        " *_ok: a cut output within the objective counted too):",
        [(m, {c: _cell(c, medians[m][c]) for c in COLUMNS}) for m in modes],
    )
    print_table(
        "spread over the rounds (min-max):",
        [
            (
                m,
                {
                    c: f"{_cell(c, min(values[m][c]))}-{_cell(c, max(values[m][c]))}"
                    for c in COLUMNS
                },
            )
            for m in modes
        ],
    )
    ratios: dict[str, dict[str, float]] = {}
    for mode, base in RATIOS:
        if mode not in modes or base not in modes:
            continue
        for column in ("high_p99", "all_good", "all_ok"):
            # Round by round (the same round ran both arms back to back), then the median.
            per_round = [
                a[column] / b[column] if b[column] else math.nan
                for a, b in zip(runs[mode], runs[base], strict=True)
            ]
            finite = [r for r in per_round if math.isfinite(r)]
            median = percentile(finite, 50, default=math.nan)
            ratios[f"{mode}/{base} {column}"] = median
            print(
                f"  {column}, {mode} / {base}: {median:.2f}"
                f" (rounds {min(finite, default=math.nan):.2f}"
                f"-{max(finite, default=math.nan):.2f}"
                f"{'' if len(finite) == len(per_round) else ', a round of 0 left out'})"
            )
    return {"low_rate": low_rate, "runs": runs, "medians": medians, "ratios": ratios}


def _modes(text: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in text.split(","))
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes or len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(
            f"expected distinct modes among {', '.join(MODES)}, got {text!r}"
        )
    return modes


def _rates(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates, got {text!r}") from None
    if not values or not all(math.isfinite(v) and v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected rates > 0, got {text!r}")
    return values


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run (one round of 8 s of arrivals per load)"
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of arrivals")
    parser.add_argument("--high-rate", type=float, default=2.0, help="high requests per second")
    parser.add_argument(
        "--low-rates",
        type=_rates,
        default=[6.0, 3.0],
        help="low requests per second, one load each (default 6,3)",
    )
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
    parser.add_argument(
        "--high-ttft-ms", type=float, default=1000.0, help="for the high goodput only"
    )
    parser.add_argument("--offload-threshold", type=int, default=256)
    parser.add_argument(
        "--prefill-chunk",
        type=int,
        default=64,
        help="the decode engine's prefill_chunk in the arms that prefill low prompts there,"
        " but degrade+qos-whole (default 64; 0: each prompt in one step)",
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of the modes per load, the order reversed every other round",
    )
    parser.add_argument(
        "--modes",
        type=_modes,
        default=DEFAULT_MODES,
        help=f"the arms, comma-separated, among {', '.join(MODES)}"
        f" (default {','.join(DEFAULT_MODES)})",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.duration = 8.0
        args.rounds = 1
    if smoke(args):  # one load, a second of arrivals, short prompts
        args.duration, args.rounds, args.low_rates = 1.0, 1, [6.0]
        args.high_tokens = args.low_tokens = 128
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(1)

    print(
        f"harness degradation: modes {', '.join(args.modes)}; low TTFT objective "
        f"{args.low_ttft_ms:.0f} ms, high {args.high_ttft_ms:.0f} ms (counted, not enforced); "
        f"torch {torch.__version__}, {platform.machine()}"
    )
    loads = [run_load(rate, args) for rate in args.low_rates]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"args": vars(args), "loads": loads}, f, indent=2)
    errors = sum(r["errors"] for load in loads for rs in load["runs"].values() for r in rs)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())

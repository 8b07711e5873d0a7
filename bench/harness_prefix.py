"""Benchmark: TTFT of a long shared prefix after eviction, paged back or recomputed.

A prompt of ``--prefix-tokens`` shared tokens and a short question runs
once (its full blocks stay in the device's prefix cache). Then other
traffic, ``--others`` distinct prompts of ``--other-tokens`` tokens, fills
the device pool (``--pool-blocks``) and evicts the prefix's blocks. Then the
same prefix comes back with another question, alone, and its TTFT (from
``add`` to the step that gives its first token) is measured. This repeats
``--cycles`` times per run, with fresh other traffic and a fresh question
each time.

Modes, each a fresh engine per run, in the same process:

- ``recompute``: no prefix tier (today's behaviour): the evicted blocks were
  dropped, the whole prompt is prefilled again.
- ``paged``: a prefix tier of ``--host-prefix-blocks`` host blocks: the
  evicted blocks were copied there and are paged back, only the question is
  prefilled.
- ``device`` (reference, not a baseline): a pool large enough that nothing
  is evicted, so the prefix is a device hit.

Rounds run every mode once, the order reversed every other round. Per run
the median TTFT over its cycles is kept; reported are the median over the
rounds and the spread (lowest and highest run), in wall time and in the
process's CPU time (every thread: the page-back's copy thread too), and the
ratios paged / recompute of the medians. The greedy outputs of the three
modes are compared. torch runs on one thread (``--threads``).

Run it (from the repository root)::

    .venv/bin/python bench/harness_prefix.py
    .venv/bin/python bench/harness_prefix.py --quick
    .venv/bin/python bench/harness_prefix.py --rounds 9 --json bench-harness-prefix.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.harness import Engine, EngineConfig, SamplingParams, SchedulerConfig

MODES = ("recompute", "paged", "device")


@dataclass(frozen=True, slots=True)
class Run:
    mode: str
    ttft_wall_ms: float  # median over the run's cycles
    ttft_cpu_ms: float
    cold_ttft_wall_ms: float  # the prefix's first, cold prefill
    prefilled: float  # prompt tokens computed for the repeated prefix, per cycle
    blocks_paged_back: int
    host_evictions: int
    stall_ms: float
    page_out_ms: float
    evictions: int
    outputs: list[list[int]]


def text(tag: str, length: int) -> list[int]:
    """``length`` bytes of text that differ from the first block on, by ``tag``."""
    body = f"{tag}: " + "the prefix cache keeps full blocks of keys and values " * 64
    return list(body.encode()[:length])


def timed_first_token(
    engine: Engine, prompt: list[int], params: SamplingParams
) -> tuple[float, float, list[int]]:
    """Wall and CPU ms from ``add`` to the step that gives ``prompt`` its first token."""
    wall, cpu = time.perf_counter(), time.process_time()
    seq = engine.add(prompt, params)
    while not seq.output:
        if engine.step() is None:
            raise RuntimeError("engine stalled")
    if engine.device.type == "cuda":
        torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - wall) * 1000.0
    cpu_ms = (time.process_time() - cpu) * 1000.0
    engine.run_until_done([seq])
    return wall_ms, cpu_ms, seq.output


def run_once(mode: str, config: EngineConfig, args: argparse.Namespace, round_no: int) -> Run:
    engine = Engine(config)
    engine.generate([text("warm-up", 48)], SamplingParams(max_tokens=4))
    engine.reset_counters()
    prefix = text("shared prefix", args.prefix_tokens)
    params = SamplingParams(max_tokens=args.max_tokens)
    other_params = SamplingParams(max_tokens=4)
    cold, _, first = timed_first_token(engine, [*prefix, *b" Question 0?"], params)
    outputs = [first]
    walls: list[float] = []
    cpus: list[float] = []
    prefilled = 0
    for cycle in range(args.cycles):
        # Other traffic, new each cycle (and each round, so no run finds another's blocks).
        others = [
            text(f"other {round_no}.{cycle}.{i}", args.other_tokens) for i in range(args.others)
        ]
        engine.generate(others, other_params)
        before = engine.prompt_tokens_computed
        question = [*prefix, *f" Question {cycle + 1}, a little longer?".encode()]
        wall_ms, cpu_ms, output = timed_first_token(engine, question, params)
        prefilled += engine.prompt_tokens_computed - before
        walls.append(wall_ms)
        cpus.append(cpu_ms)
        outputs.append(output)
    stats = engine.stats()
    return Run(
        mode=mode,
        ttft_wall_ms=percentile(walls, 50),
        ttft_cpu_ms=percentile(cpus, 50),
        cold_ttft_wall_ms=cold,
        prefilled=prefilled / args.cycles,
        blocks_paged_back=stats["kv_prefix_blocks_paged_back"],
        host_evictions=stats["kv_prefix_host_evictions"],
        stall_ms=stats["kv_prefix_stall_ms"],
        page_out_ms=stats["kv_prefix_page_out_ms"],
        evictions=stats["kv_evictions"],
        outputs=outputs,
    )


def summary(runs: list[Run], field: str) -> tuple[float, float, float]:
    values = [float(getattr(r, field)) for r in runs]
    return percentile(values, 50), min(values), max(values)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--cycles", type=int, default=3, help="evictions and hits per run")
    parser.add_argument("--prefix-tokens", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--pool-blocks", type=int, default=0, help="default: twice the prefix's")
    parser.add_argument("--others", type=int, default=12, help="other prompts per cycle")
    parser.add_argument("--other-tokens", type=int, default=256)
    parser.add_argument("--host-prefix-blocks", type=int, default=0, help="default: twice the pool")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--quick", action="store_true", help="a short run: smaller everything")
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.cycles, args.prefix_tokens = 2, 2, 256
        args.others, args.other_tokens = 6, 128
    if smoke(args):  # --quick, one round of one cycle
        args.rounds, args.cycles, args.prefix_tokens = 1, 1, 256
        args.others, args.other_tokens = 6, 128
    torch.set_num_threads(args.threads)
    block_size = 16
    prefix_blocks = args.prefix_tokens // block_size
    pool = args.pool_blocks or 2 * prefix_blocks
    host = args.host_prefix_blocks or 2 * pool
    scheduler = SchedulerConfig(max_num_seqs=4)
    if -(-args.others * (args.other_tokens + 4) // block_size) <= pool:
        parser.error("the other traffic must need more blocks than the pool has, to evict")
    # Room for every block the run ever fills: the device mode evicts nothing.
    other_blocks = -(-(args.other_tokens + 4) // block_size)
    everything = 2 * (prefix_blocks + 4) + args.cycles * (args.others * other_blocks + 4) + 8
    configs = {
        "recompute": EngineConfig(device=args.device, num_blocks=pool, scheduler=scheduler),
        "paged": EngineConfig(
            device=args.device, num_blocks=pool, scheduler=scheduler, host_prefix_blocks=host
        ),
        "device": EngineConfig(device=args.device, num_blocks=everything, scheduler=scheduler),
    }
    runs: dict[str, list[Run]] = {mode: [] for mode in MODES}
    for round_no in range(args.rounds):
        order = MODES if round_no % 2 == 0 else tuple(reversed(MODES))
        for mode in order:
            runs[mode].append(run_once(mode, configs[mode], args, round_no))

    device = Engine(EngineConfig(device=args.device, num_blocks=1)).device
    print(
        f"harness prefix tier, {args.rounds} round(s) x {args.cycles} cycle(s), device {device}, "
        f"{args.threads} torch thread(s), torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}"
    )
    print(
        f"prefix {args.prefix_tokens} tokens ({prefix_blocks} blocks); device pool {pool} blocks "
        f"(device mode {configs['device'].num_blocks}); each cycle {args.others} other prompts "
        f"of {args.other_tokens} tokens; prefix tier {host} host blocks"
    )
    print(
        f"{'mode':<10} {'TTFT ms (wall)':>22} {'TTFT ms (cpu)':>22} {'cold ms':>8} "
        f"{'prefilled':>9} {'paged back':>10} {'host evict':>10} {'stall ms':>8} "
        f"{'page-out ms':>11} {'evictions':>9}"
    )
    for mode in MODES:
        r = runs[mode]
        wall, wall_lo, wall_hi = summary(r, "ttft_wall_ms")
        cpu, cpu_lo, cpu_hi = summary(r, "ttft_cpu_ms")
        print(
            f"{mode:<10} {wall:>8.2f} ({wall_lo:.2f}-{wall_hi:.2f}) "
            f"{cpu:>8.2f} ({cpu_lo:.2f}-{cpu_hi:.2f}) "
            f"{summary(r, 'cold_ttft_wall_ms')[0]:>8.2f} {summary(r, 'prefilled')[0]:>9.0f} "
            f"{summary(r, 'blocks_paged_back')[0]:>10.0f} {summary(r, 'host_evictions')[0]:>10.0f} "
            f"{summary(r, 'stall_ms')[0]:>8.2f} {summary(r, 'page_out_ms')[0]:>11.2f} "
            f"{summary(r, 'evictions')[0]:>9.0f}"
        )
    ratio_wall = (
        summary(runs["paged"], "ttft_wall_ms")[0] / summary(runs["recompute"], "ttft_wall_ms")[0]
    )
    ratio_cpu = (
        summary(runs["paged"], "ttft_cpu_ms")[0] / summary(runs["recompute"], "ttft_cpu_ms")[0]
    )
    per_round = [
        p.ttft_wall_ms / c.ttft_wall_ms
        for p, c in zip(runs["paged"], runs["recompute"], strict=True)
    ]
    reference = runs["recompute"][0].outputs
    identical = all(run.outputs == reference for mode in MODES for run in runs[mode])
    print(
        f"paged back vs recomputed, TTFT after eviction: {ratio_wall:.3f}x wall "
        f"(per round {min(per_round):.3f}-{max(per_round):.3f}), {ratio_cpu:.3f}x CPU"
    )
    print(f"greedy outputs identical across modes and rounds: {'yes' if identical else 'NO'}")
    if args.json:
        payload: dict[str, Any] = {
            "device": str(device),
            "args": vars(args),
            "ratio_wall": ratio_wall,
            "ratio_cpu": ratio_cpu,
            "outputs_identical": identical,
            "runs": {
                mode: [{k: v for k, v in asdict(r).items() if k != "outputs"} for r in rs]
                for mode, rs in runs.items()
            },
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())

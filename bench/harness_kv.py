"""Benchmark: the harness's KV memory hierarchy and int8 KV, each against its baseline in one run.

(a) Paging against preemption by recompute. ``--requests`` requests with
distinct prompts of ``--prompt-tokens`` bytes, all queued at once, generate
``--max-tokens`` greedy tokens each, ``--max-num-seqs`` at a time. The device
pool holds ``--pool-share`` of the KV the running sequences need at their
longest, so sequences must give up their blocks. The baseline preempts the
newest running sequence and prefills it again later (recompute); the other
engine pages it out to a host tier big enough for the overflow
(``host_kv_blocks``) and back in. Reported: generated tokens per second of
wall time (everything: prefill, recompute, copies, decode), and TPOT
per request, ``(last token - first token) / (tokens - 1)`` in wall time,
at p50 and p99 (nearest rank, ``yieldgate._stats.percentile``).

(b) int8 against float32 KV in the same memory. ``--budget-blocks`` float32
blocks' worth of bytes is given to each engine as KV blocks of its own
dtype (int8 blocks are about a quarter of the size, so about four times as
many). ``--int8-requests`` requests of the same shape, queued at once, run
to completion without a host tier, ``--max-num-seqs`` at a time. Reported:
the sequences held at once (the largest and the mean decode batch) and
generated tokens per second.

Time is the process's CPU time by default (``--clock cpu``): the machine
these figures come from is shared, and CPU time does not count the time
other processes hold the cores. On a quiet machine the engine runs on one
thread, so it is close to wall time; ``--clock wall`` uses wall time. Rounds
repeat both parts, alternating the order; the median per figure is
reported. torch runs on one thread (``--threads``), as a harness worker does.

Run it (from the repository root)::

    .venv/bin/python bench/harness_kv.py
    .venv/bin/python bench/harness_kv.py --quick
    .venv/bin/python bench/harness_kv.py --rounds 5 --device cuda --json bench-harness-kv.json
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


@dataclass(frozen=True, slots=True)
class Run:
    label: str
    num_blocks: int
    tokens: int
    wall_s: float
    tpot_p50_ms: float
    tpot_p99_ms: float
    held_max: int
    held_mean: float
    preemptions: int
    swap_outs: int
    prompt_tokens_computed: int
    kv_bytes_moved: int
    stall_ms: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def prompts(n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` bytes that differ from their first block on."""
    out = []
    for i in range(n):
        text = f"request {i:04d}: " + "paged attention keeps the cache in blocks " * 64
        out.append(list(text.encode()[:length]))
    return out


def run_once(label: str, config: EngineConfig, args: argparse.Namespace, requests: int) -> Run:
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    engine = Engine(config)
    engine.generate(prompts(2, 32), SamplingParams(max_tokens=4))  # warm-up
    engine.reset_counters()
    params = SamplingParams(max_tokens=args.max_tokens)
    seqs = [engine.add(p, params) for p in prompts(requests, args.prompt_tokens)]
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    held: list[int] = []
    started = clock()
    while not all(seq.is_finished for seq in seqs):
        result = engine.step()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        if result is None:
            raise RuntimeError("engine stalled")
        now = clock()
        if not result.is_prefill:
            held.append(len(result.seqs))
        for seq in result.seqs:
            first.setdefault(seq.id, now)
            last[seq.id] = now
    wall = clock() - started
    tpot = [(last[s.id] - first[s.id]) * 1000.0 / (s.num_output - 1) for s in seqs]
    stats = engine.stats()
    return Run(
        label=label,
        num_blocks=config.num_blocks,
        tokens=sum(seq.num_output for seq in seqs),
        wall_s=wall,
        tpot_p50_ms=percentile(tpot, 50),
        tpot_p99_ms=percentile(tpot, 99),
        held_max=max(held),
        held_mean=sum(held) / len(held),
        preemptions=stats["preemptions"],
        swap_outs=stats["kv_swap_outs"],
        prompt_tokens_computed=stats["prompt_tokens_computed"],
        kv_bytes_moved=stats["kv_bytes_out"] + stats["kv_bytes_in"],
        stall_ms=stats["kv_stall_ms"],
    )


def median(runs: list[Run], field: str) -> float:
    return percentile([float(getattr(r, field)) for r in runs], 50)


def report_paging(
    runs: dict[str, list[Run]], args: argparse.Namespace, pool: int, peak: int, full_block: int
) -> tuple[float, float]:
    print(
        f"\n(a) paging vs recompute: {args.requests} requests, {args.prompt_tokens} + "
        f"{args.max_tokens} tokens, {args.max_num_seqs} at a time; device pool {pool} blocks "
        f"({pool * full_block / 2**20:.1f} MiB) of the {peak} they need; host tier {peak} blocks"
    )
    print(
        f"{'mode':<10} {'tok/s':>8} {'TPOT p50':>9} {'TPOT p99':>9} {'preempt':>8} "
        f"{'swaps':>6} {'prefilled':>9} {'KV moved':>9} {'stall ms':>9}"
    )
    for name in ("recompute", "paging"):
        r = runs[name]
        print(
            f"{name:<10} {median(r, 'tokens_per_s'):>8,.0f} {median(r, 'tpot_p50_ms'):>9.2f} "
            f"{median(r, 'tpot_p99_ms'):>9.2f} {median(r, 'preemptions'):>8.0f} "
            f"{median(r, 'swap_outs'):>6.0f} {median(r, 'prompt_tokens_computed'):>9,.0f} "
            f"{median(r, 'kv_bytes_moved') / 2**20:>7.1f}Mi {median(r, 'stall_ms'):>9.2f}"
        )
    throughput = median(runs["paging"], "tokens_per_s") / median(runs["recompute"], "tokens_per_s")
    tpot_p99 = median(runs["paging"], "tpot_p99_ms") / median(runs["recompute"], "tpot_p99_ms")
    print(f"paging vs recompute: throughput {throughput:.2f}x, p99 TPOT {tpot_p99:.2f}x")
    return throughput, tpot_p99


def report_int8(
    runs: dict[str, list[Run]],
    args: argparse.Namespace,
    configs: dict[str, EngineConfig],
    budget: int,
    ratio: float,
) -> tuple[float, float]:
    print(
        f"\n(b) int8 vs float32 KV in the same {budget / 2**20:.1f} MiB: {args.int8_requests} "
        f"requests, {args.prompt_tokens} + {args.max_tokens} tokens, no host tier"
    )
    print(f"{'KV':<8} {'blocks':>7} {'held max':>9} {'held mean':>10} {'tok/s':>8} {'preempt':>8}")
    for name in ("float32", "int8"):
        r = runs[name]
        print(
            f"{name:<8} {configs[name].num_blocks:>7} {median(r, 'held_max'):>9.0f} "
            f"{median(r, 'held_mean'):>10.1f} {median(r, 'tokens_per_s'):>8,.0f} "
            f"{median(r, 'preemptions'):>8.0f}"
        )
    held = median(runs["int8"], "held_mean") / median(runs["float32"], "held_mean")
    tokens = median(runs["int8"], "tokens_per_s") / median(runs["float32"], "tokens_per_s")
    print(
        f"int8 vs float32: bytes per block {ratio:.2f}x smaller, sequences held {held:.2f}x "
        f"(mean), tokens/s {tokens:.2f}x"
    )
    return held, tokens


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--pool-share", type=float, default=0.5)
    parser.add_argument("--budget-blocks", type=int, default=48)
    parser.add_argument("--int8-requests", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument(
        "--clock",
        choices=("cpu", "wall"),
        default="cpu",
        help="time by the process's CPU time (default: steady on a shared machine) or wall time",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--part", choices=("a", "b", "both"), default="both")
    parser.add_argument("--quick", action="store_true", help="a short run: smaller everything")
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.requests, args.max_num_seqs = 1, 12, 8
        args.prompt_tokens, args.max_tokens = 32, 96
        args.budget_blocks, args.int8_requests = 16, 12
    if smoke(args):  # --quick, smaller still
        args.rounds, args.requests, args.max_num_seqs = 1, 6, 4
        args.prompt_tokens, args.max_tokens = 16, 32
        args.budget_blocks, args.int8_requests = 8, 6
    torch.set_num_threads(args.threads)

    block_size = 16
    seq_blocks = -(-(args.prompt_tokens + args.max_tokens) // block_size)
    peak = seq_blocks * args.max_num_seqs
    pool = max(seq_blocks, int(peak * args.pool_share))
    scheduler = SchedulerConfig(max_num_seqs=args.max_num_seqs)
    paging_configs = {
        "recompute": EngineConfig(device=args.device, num_blocks=pool, scheduler=scheduler),
        "paging": EngineConfig(
            device=args.device, num_blocks=pool, scheduler=scheduler, host_kv_blocks=peak
        ),
    }
    probe = Engine(EngineConfig(device=args.device, num_blocks=1))
    full_block = probe.cache.bytes_per_block
    int8_block = Engine(EngineConfig(device=args.device, num_blocks=1, kv_dtype="int8"))
    budget = args.budget_blocks * full_block
    wide = SchedulerConfig(max_num_seqs=args.max_num_seqs)
    dtype_configs = {
        "float32": EngineConfig(device=args.device, num_blocks=args.budget_blocks, scheduler=wide),
        "int8": EngineConfig(
            device=args.device,
            num_blocks=budget // int8_block.cache.bytes_per_block,
            scheduler=wide,
            kv_dtype="int8",
        ),
    }
    groups = []
    if args.part in ("a", "both"):
        groups.append((paging_configs, args.requests))
    if args.part in ("b", "both"):
        groups.append((dtype_configs, args.int8_requests))

    runs: dict[str, list[Run]] = {name: [] for name in (*paging_configs, *dtype_configs)}
    for round_no in range(args.rounds):
        for group, requests in groups:
            names = list(group) if round_no % 2 == 0 else list(reversed(group))
            for name in names:
                runs[name].append(run_once(name, group[name], args, requests))

    print(
        f"harness KV, {args.rounds} round(s), device {probe.device}, {args.threads} torch "
        f"thread(s), {args.clock} clock, torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}"
    )
    payload: dict[str, Any] = {"device": str(probe.device), "args": vars(args)}
    if args.part in ("a", "both"):
        throughput, tpot_p99 = report_paging(runs, args, pool, peak, full_block)
        payload["paging_vs_recompute"] = {"throughput": throughput, "tpot_p99": tpot_p99}
    if args.part in ("b", "both"):
        ratio = full_block / int8_block.cache.bytes_per_block
        held, tokens = report_int8(runs, args, dtype_configs, budget, ratio)
        payload["int8_vs_float32"] = {"bytes": ratio, "held_mean": held, "tokens_per_s": tokens}
    if args.json:
        payload["runs"] = {name: [asdict(r) for r in rs] for name, rs in runs.items() if rs}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

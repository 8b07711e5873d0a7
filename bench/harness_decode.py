"""Benchmark: the harness engine's decode throughput at 1, 4 and 16 concurrent streams.

What it measures. For each concurrency N, a fresh ``Engine`` (the default
tiny transformer, the same seeded weights each time) is warmed up, then N
requests with distinct prompts of ``--prompt-tokens`` bytes are added at once
and run to ``--max-tokens`` each with greedy decoding. Only decode steps
count: their tokens over the wall-clock time of those ``Engine.step`` calls
(scheduling, input preparation, the forward pass and sampling included; the
prefill step excluded). The N streams start and end together, so every
decode step carries all N. Rounds repeat the three runs; the median per N is
reported (nearest rank, ``yieldgate._stats.percentile``: the lower middle
round of an even number), and the figure that matters is the ratio of decode
tokens/s at 16 streams to 1 stream, measured in the same run (goal on CPU: >= 4x).

torch runs on one thread (``--threads``), as a harness worker process does.

Run it (from the repository root)::

    .venv/bin/python bench/harness_decode.py
    .venv/bin/python bench/harness_decode.py --rounds 5 --max-tokens 128 --device cuda \\
        --json bench-harness-decode.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from yieldgate._stats import percentile
from yieldgate.harness import Engine, EngineConfig, SamplingParams, SchedulerConfig

GOAL_RATIO = 4.0
CONCURRENCY = (1, 4, 16)


@dataclass(frozen=True, slots=True)
class Run:
    streams: int
    decode_tokens: int
    decode_s: float
    decode_steps: int

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s

    @property
    def step_ms(self) -> float:
        return self.decode_s / self.decode_steps * 1000.0


def prompts(n: int, length: int) -> list[list[int]]:
    """``n`` prompts of ``length`` bytes that differ from their first block on."""
    out = []
    for i in range(n):
        text = f"stream {i:03d}: " + "the quick brown fox jumps over the lazy dog " * 64
        out.append(list(text.encode()[:length]))
    return out


def run_once(streams: int, args: argparse.Namespace) -> Run:
    engine = Engine(
        EngineConfig(
            device=args.device,
            num_blocks=args.kv_blocks,
            scheduler=SchedulerConfig(max_num_seqs=max(CONCURRENCY)),
        )
    )
    engine.generate(prompts(2, 64), SamplingParams(max_tokens=8))  # warm-up
    seqs = [
        engine.add(prompt, SamplingParams(max_tokens=args.max_tokens))
        for prompt in prompts(streams, args.prompt_tokens)
    ]
    tokens = steps = 0
    elapsed = 0.0
    while not all(seq.is_finished for seq in seqs):
        started = time.perf_counter()
        result = engine.step()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        took = time.perf_counter() - started
        if result is None:
            raise RuntimeError("engine stalled")
        if not result.is_prefill:
            assert len(result.seqs) == streams, "a decode step did not carry every stream"
            tokens += len(result.seqs)
            steps += 1
            elapsed += took
    return Run(streams=streams, decode_tokens=tokens, decode_s=elapsed, decode_steps=steps)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kv-blocks", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    runs: dict[int, list[Run]] = {n: [] for n in CONCURRENCY}
    for round_no in range(args.rounds):
        order = CONCURRENCY if round_no % 2 == 0 else tuple(reversed(CONCURRENCY))
        for streams in order:
            runs[streams].append(run_once(streams, args))

    device = Engine(EngineConfig(device=args.device, num_blocks=1)).device
    print(
        f"harness decode, {args.rounds} rounds, prompts of {args.prompt_tokens} tokens, "
        f"{args.max_tokens} tokens each, device {device}, {args.threads} torch thread(s), "
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}"
    )
    print(f"{'streams':>7} {'decode tok/s':>13} {'step ms':>8} {'vs 1 stream':>12}")
    medians = {n: percentile([r.tokens_per_s for r in runs[n]], 50) for n in CONCURRENCY}
    step_ms = {n: percentile([r.step_ms for r in runs[n]], 50) for n in CONCURRENCY}
    for n in CONCURRENCY:
        print(f"{n:>7} {medians[n]:>13,.0f} {step_ms[n]:>8.2f} {medians[n] / medians[1]:>11.2f}x")
    ratio = medians[16] / medians[1]
    verdict = "met" if ratio >= GOAL_RATIO else "NOT met"
    print(f"ratio 16 vs 1 stream: {ratio:.2f}x (goal >= {GOAL_RATIO:.0f}x: {verdict})")
    if args.json:
        payload = {
            "device": str(device),
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "tokens_per_s": {str(n): medians[n] for n in CONCURRENCY},
            "step_ms": {str(n): step_ms[n] for n in CONCURRENCY},
            "ratio_16_vs_1": ratio,
            "runs": {str(n): [asdict(r) for r in runs[n]] for n in CONCURRENCY},
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

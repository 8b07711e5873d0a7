"""Benchmark: the harness engine's decode throughput with speculative decoding against without.

What it measures. One plain ``Engine`` (the default tiny transformer) and
one per speculative setting (``k`` of 2 and 4, and 4 with branches), all on
the same seeded weights, are built once; the speculative ones distil their
draft's exit head at construction (its cost and the draft's agreement with
the target on its training positions are printed). Then, for 1 and 4
concurrent streams, each engine runs the same greedy requests (distinct
prompts of ``--prompt-tokens`` bytes, ``--max-tokens`` each; prompts the
distillation never saw). Only decode steps count: tokens gained over the
wall-clock time of those ``Engine.step`` calls (drafting, verifying,
rollback and sampling included; prefill excluded). Rounds repeat every
run, in alternating order; medians are reported (nearest rank), with each
speculative run's ratio to the plain engine at the same concurrency, from
the same round set. Every speculative run's output is checked against the
plain engine's (greedy decoding must be identical), so a speed-up can
never come from a wrong answer.

torch runs on one thread (``--threads``), as a harness worker process does.

Run it (from the repository root)::

    .venv/bin/python bench/harness_spec.py
    .venv/bin/python bench/harness_spec.py --quick
    .venv/bin/python bench/harness_spec.py --device cuda --json bench-harness-spec.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.harness import Engine, EngineConfig, SamplingParams, SchedulerConfig
from yieldgate.harness.speculative import SpeculativeConfig

SETTINGS: dict[str, SpeculativeConfig | None] = {
    "off": None,
    "k=2": SpeculativeConfig(k=2),
    "k=4": SpeculativeConfig(k=4),
    "k=4+branch": SpeculativeConfig(k=4, branch_threshold=0.5, max_extra_tokens=4),
}


@dataclass(frozen=True, slots=True)
class Run:
    setting: str
    streams: int
    decode_tokens: int
    decode_s: float
    decode_steps: int
    drafted: int
    accepted: int
    branches: int
    branch_hits: int
    draft_ms: float  # per decode step
    verify_ms: float

    @property
    def tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_s

    @property
    def step_ms(self) -> float:
        return self.decode_s / self.decode_steps * 1000.0


def prompts(n: int, length: int, offset: int) -> list[list[int]]:
    """``n`` prompts of ``length`` bytes that differ from their first block on."""
    out = []
    for i in range(n):
        text = f"stream {offset + i:03d}: " + "the quick brown fox jumps over the lazy dog " * 64
        out.append(list(text.encode()[:length]))
    return out


def run_once(
    engine: Engine, setting: str, streams: int, round_no: int, args: argparse.Namespace
) -> tuple[Run, list[list[int]]]:
    engine.reset_counters()
    seqs = [
        engine.add(prompt, SamplingParams(max_tokens=args.max_tokens))
        for prompt in prompts(streams, args.prompt_tokens, 100 * round_no)
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
            tokens += len(result.tokens)
            steps += 1
            elapsed += took
    stats = engine.stats()
    run = Run(
        setting=setting,
        streams=streams,
        decode_tokens=tokens,
        decode_s=elapsed,
        decode_steps=steps,
        drafted=stats.get("spec_drafted", 0),
        accepted=stats.get("spec_accepted", 0),
        branches=stats.get("spec_branches", 0),
        branch_hits=stats.get("spec_branch_hits", 0),
        draft_ms=stats.get("spec_draft_ms_per_step") or 0.0,
        verify_ms=stats.get("spec_verify_ms_per_step") or 0.0,
    )
    return run, [seq.output for seq in seqs]


def kv_transfer_ms(tokens: int, config: EngineConfig) -> tuple[float, int]:
    """Median time to move ``tokens`` positions of KV between two gloo ranks (two threads).

    The least that verifying a branch on another worker would add: that
    worker has no copy of the sequence's KV.
    """
    from yieldgate.harness.transfer import connect_group, tcp_store

    model = config.model
    kv = torch.randn(2, model.n_layers, tokens, model.n_heads, model.head_dim)
    master = tcp_store(0, 2, is_master=True, timeout_s=30)
    groups: dict[int, Any] = {}

    def join(rank: int, store: Any) -> None:
        groups[rank] = connect_group(store, rank, 2, 30)

    peer = threading.Thread(
        target=join, args=(1, tcp_store(master.port, 2, is_master=False, timeout_s=30))
    )
    peer.start()
    join(0, master)
    peer.join()
    buf = torch.empty_like(kv)
    times = []
    for _ in range(21):
        started = time.perf_counter()
        received = groups[1].recv([buf], 0, 0)
        groups[0].send([kv], 1, 0).wait()
        received.wait()
        times.append((time.perf_counter() - started) * 1000.0)
    return percentile(times, 50), kv.numel() * kv.element_size()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--streams", default="1,4", help="concurrencies, comma-separated")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="1 round of 48 tokens (a smoke run)")
    parser.add_argument("--json", help="also write the results to this file")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.max_tokens = 1, 48
    if smoke(args):  # and drafts distilled in a few steps
        args.rounds, args.max_tokens, args.streams = 1, 16, "1,2"
        short = {"distill_steps": 20, "distill_sequences": 4, "distill_tokens": 16}
        for name, spec in SETTINGS.items():
            SETTINGS[name] = None if spec is None else replace(spec, **short)
    concurrency = [int(n) for n in args.streams.split(",")]
    torch.set_num_threads(args.threads)

    engines: dict[str, Engine] = {}
    distill: dict[str, dict[str, float]] = {}
    for name, spec in SETTINGS.items():
        engines[name] = Engine(
            EngineConfig(
                device=args.device,
                speculative=spec,
                scheduler=SchedulerConfig(max_num_seqs=max(concurrency)),
            )
        )
        engines[name].generate(prompts(2, 64, 900), SamplingParams(max_tokens=8))  # warm-up
        if engines[name].speculator is not None:
            distill[name] = engines[name].speculator.distillation  # type: ignore[union-attr]

    runs: dict[tuple[str, int], list[Run]] = {}
    names = list(SETTINGS)
    for round_no in range(args.rounds):
        for streams in concurrency:
            expected: list[list[int]] | None = None
            order = names if round_no % 2 == 0 else list(reversed(names))
            outputs: dict[str, list[list[int]]] = {}
            for name in order:
                run, outputs[name] = run_once(engines[name], name, streams, round_no, args)
                runs.setdefault((name, streams), []).append(run)
            expected = outputs["off"]
            for name in names:
                if outputs[name] != expected:
                    raise SystemExit(f"{name}: greedy output differs from plain decoding")

    device = engines["off"].device
    print(
        f"harness speculative decoding, {args.rounds} rounds, prompts of {args.prompt_tokens} "
        f"tokens, {args.max_tokens} tokens each, device {device}, {args.threads} torch "
        f"thread(s), torch {torch.__version__}, {platform.processor() or platform.machine()}"
    )
    for name, info in distill.items():
        print(
            f"  {name}: draft = first {SETTINGS[name].draft_layers} layer(s) + exit head "  # type: ignore[union-attr]
            f"distilled in {info['seconds']:.1f} s on {info['positions']:.0f} positions "
            f"(top-1 agreement {info['agreement_before']:.0%} -> {info['agreement_after']:.0%})"
        )
    print(
        f"{'setting':>11} {'streams':>7} {'decode tok/s':>13} {'step ms':>8} {'tok/seq/step':>12} "
        f"{'accept':>7} {'branches':>9} {'draft ms':>9} {'verify ms':>10} {'vs off':>7}"
    )
    table: dict[str, dict[str, float | None]] = {}
    for streams in concurrency:
        base = percentile([r.tokens_per_s for r in runs[("off", streams)]], 50)
        for name in names:
            rs = runs[(name, streams)]
            tps = percentile([r.tokens_per_s for r in rs], 50)
            step_ms = percentile([r.step_ms for r in rs], 50)
            per_step = sum(r.decode_tokens for r in rs) / sum(r.decode_steps for r in rs) / streams
            drafted = sum(r.drafted for r in rs)
            rate = sum(r.accepted for r in rs) / drafted if drafted else None
            branches = sum(r.branches for r in rs)
            hits = sum(r.branch_hits for r in rs)
            print(
                f"{name:>11} {streams:>7} {tps:>13,.0f} {step_ms:>8.2f} {per_step:>12.2f} "
                f"{'-' if rate is None else f'{rate:.0%}':>7} "
                f"{f'{hits}/{branches}' if branches else '-':>9} "
                f"{percentile([r.draft_ms for r in rs], 50):>9.2f} "
                f"{percentile([r.verify_ms for r in rs], 50):>10.2f} {tps / base:>6.2f}x"
            )
            table[f"{name}@{streams}"] = {
                "tokens_per_s": tps,
                "step_ms": step_ms,
                "tokens_per_seq_step": per_step,
                "acceptance_rate": rate,
                "branches_per_step": branches / sum(r.decode_steps for r in rs),
                "verify_ms": percentile([r.verify_ms for r in rs], 50),
                "ratio_vs_off": tps / base,
            }
    context = args.prompt_tokens + args.max_tokens
    transfer_ms, nbytes = kv_transfer_ms(context, engines["off"].config)
    print(
        f"moving one {context}-token context's KV ({nbytes / 1024:,.0f} KiB) between two gloo "
        f"ranks in-process: {transfer_ms:.2f} ms (the floor for a branch on another worker)"
    )
    if args.json:
        payload = {
            "device": str(device),
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "distillation": distill,
            "kv_transfer_ms": transfer_ms,
            "results": table,
            "runs": {f"{k[0]}@{k[1]}": [asdict(r) for r in v] for k, v in runs.items()},
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: the harness engine's decode throughput at 1, 4 and 16 concurrent streams.

What it measures. For each concurrency N, a fresh ``Engine`` (the default
tiny transformer, the same seeded weights each time) is warmed up, then N
requests with distinct prompts of ``--prompt-tokens`` bytes are added at once
and run to ``--max-tokens`` each with greedy decoding. Only decode steps
count: their tokens over the wall-clock time (``--clock cpu``: this thread's
CPU time) of those ``Engine.step`` calls
(scheduling, input preparation, the forward pass and sampling included; the
prefill step excluded). The N streams start and end together, so every
decode step carries all N. Rounds repeat the three runs; the median per N is
reported (nearest rank, ``yieldgate._stats.percentile``: the lower middle
round of an even number), and the figure that matters is the ratio of decode
tokens/s at 16 streams to 1 stream, measured in the same run (goal on CPU: >= 4x).

The roofline. That ratio grows when one stream gets slower, so the 16-stream
figure is also put against what this CPU's matmuls can do for this model:

    FLOPs per token = 2 x P + 4 x n_layers x d_model x C

where P is the number of weights in the model's matmuls (every linear layer,
the output head included; embeddings are lookups, biases are left out) and C
the mean context a decode step attends over (``--prompt-tokens`` plus half of
``--max-tokens``: query-key scores and the probability-weighted values, two
FLOPs per multiply-add each). The share is FLOPs per token x decode tokens/s
at 16 streams over the GFLOP/s that ``torch.nn.functional.linear`` reaches on
one thread for 16 rows through the model's own weight matrices, in the model's
order, measured in each round beside the decode runs (goal: >= 0.5). With
``--profile``, one 16-stream decode also runs under ``torch.profiler`` and the
operators taking the most time are listed.

``--compare`` (issue 42) measures 16 streams only, in every model / KV
configuration (float32 / float32, float32 / bfloat16 and float32 / float16
(half KV for a float32 model, attention in the half dtype), bfloat16 /
bfloat16, float32 / int8, bfloat16 / int8), float KV also gathered from the paged cache every step
(``gathered``: ``resident_kv=False``, the decode before its resident rows)
and int8 also by its decode path before issue 42 (two fresh copies per
gathered tensor, ``model.INT8_BEFORE_ISSUE_42``), in the same process, in
alternated rounds (the order reversed every other round), each with its
dtype's matmul roofline measured in the same round; it reports min, median
and max of each and the paired ratios per round (resident against gathered,
int8 now against before, bfloat16 against float32). ``--gather`` makes the
other modes gather too.

``--dtype`` sets the model's dtype and ``--kv-dtype`` the KV cache's storage
(``EngineConfig.dtype`` and ``kv_dtype``; defaults float32 and auto); the
roofline's matmuls then run in the model's dtype, weights and inputs alike.

torch runs on one thread (``--threads``), as a harness worker process does.

Run it (from the repository root)::

    .venv/bin/python bench/harness_decode.py
    .venv/bin/python bench/harness_decode.py --rounds 1 --profile
    .venv/bin/python bench/harness_decode.py --dtype bfloat16
    .venv/bin/python bench/harness_decode.py --kv-dtype int8
    .venv/bin/python bench/harness_decode.py --compare --rounds 7
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

from _common import add_smoke_flag, smoke
from yieldgate._stats import percentile
from yieldgate.harness import Engine, EngineConfig, SamplingParams, SchedulerConfig

GOAL_RATIO = 4.0
GOAL_ROOFLINE = 0.5
CONCURRENCY = (1, 4, 16)
ROOFLINE_ROWS = 16
# What the decode steps and the roofline's matmuls are timed by: wall time, or
# with ``--clock cpu`` this thread's CPU time (torch runs on this one thread),
# which does not count the time other processes hold the core on a shared machine.
clock = time.perf_counter


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


def warm_engine(args: argparse.Namespace) -> Engine:
    """A fresh engine as the options describe it, warmed up (two short requests)."""
    engine = Engine(
        EngineConfig(
            device=args.device,
            num_blocks=args.kv_blocks,
            dtype=args.dtype,
            kv_dtype=args.kv_dtype,
            scheduler=SchedulerConfig(max_num_seqs=max(CONCURRENCY)),
            resident_kv=args.resident,
        )
    )
    engine.generate(prompts(2, 64), SamplingParams(max_tokens=8))
    return engine


def run_once(streams: int, args: argparse.Namespace) -> Run:
    engine = warm_engine(args)
    seqs = [
        engine.add(prompt, SamplingParams(max_tokens=args.max_tokens))
        for prompt in prompts(streams, args.prompt_tokens)
    ]
    tokens = steps = 0
    elapsed = 0.0
    while not all(seq.is_finished for seq in seqs):
        started = clock()
        result = engine.step()
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        took = clock() - started
        if result is None:
            raise RuntimeError("engine stalled")
        if not result.is_prefill:
            assert len(result.seqs) == streams, "a decode step did not carry every stream"
            tokens += len(result.seqs)
            steps += 1
            elapsed += took
    return Run(streams=streams, decode_tokens=tokens, decode_s=elapsed, decode_steps=steps)


def flops_per_token(model: torch.nn.Module, context: float) -> float:
    """2 x the matmul weights plus the attention over ``context`` tokens, per layer."""
    config = model.config
    weights = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    return 2.0 * weights + 4.0 * config.n_layers * config.d_model * context


def matmul_gflops(model: torch.nn.Module, repeats: int = 7, passes: int = 50) -> float:
    """GFLOP/s of ``F.linear`` on one thread, 16 rows through every linear layer of ``model``.

    Inputs are in the weights' dtype, so a bfloat16 model is put against bfloat16
    matmuls (the decode computes in that dtype too). The median of ``repeats``
    timings of ``passes`` passes over the layers.
    """
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [
        torch.randn(ROOFLINE_ROWS, m.in_features, device=m.weight.device, dtype=m.weight.dtype)
        for m in linears
    ]
    flops = sum(2.0 * ROOFLINE_ROWS * m.weight.numel() for m in linears) * passes
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            times = []
            for _ in range(repeats + 1):  # the first is a warm-up
                started = clock()
                for _ in range(passes):
                    for m, x in zip(linears, inputs, strict=True):
                        torch.nn.functional.linear(x, m.weight, m.bias)
                if inputs[0].device.type == "cuda":
                    torch.cuda.synchronize()
                times.append(clock() - started)
    finally:
        torch.set_num_threads(threads)
    return flops / percentile(times[1:], 50) / 1e9


def profile_decode(args: argparse.Namespace, top: int = 12) -> None:
    """One 16-stream decode under ``torch.profiler``: the operators by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    engine = warm_engine(args)
    seqs = [
        engine.add(p, SamplingParams(max_tokens=args.max_tokens))
        for p in prompts(max(CONCURRENCY), args.prompt_tokens)
    ]
    engine.step()  # the prefill, outside the profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        steps = 0
        started = time.perf_counter()
        while not all(seq.is_finished for seq in seqs):
            engine.step()
            steps += 1
        wall = time.perf_counter() - started
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    print(
        f"profile of one {max(CONCURRENCY)}-stream decode: {steps} steps, "
        f"{wall / steps * 1000:.2f} ms a step under the profiler; by self CPU time:"
    )
    print(
        f"  operators: {total / steps / 1000:.2f} ms a step of {wall / steps * 1000:.2f}; the "
        "rest is Python around them (scheduling, input preparation, sampling, the profiler)"
    )
    for e in events[:top]:
        per_step_ms = e.self_cpu_time_total / steps / 1000
        print(
            f"  {e.key[:48]:<48} {e.self_cpu_time_total / total:>6.1%} "
            f"{e.count / steps:>6.1f} calls/step {per_step_ms:>7.3f} ms/step"
        )


# label, model dtype, KV dtype, int8 as before issue 42, resident rows (None: the default)
COMPARED = (
    ("f32/f32", "float32", "auto", False, None),
    ("f32/f32 gathered", "float32", "auto", False, False),
    ("f32/bf16", "float32", "bfloat16", False, None),
    ("f32/f16", "float32", "float16", False, None),
    ("bf16/bf16", "bfloat16", "auto", False, None),
    ("bf16/bf16 gathered", "bfloat16", "auto", False, False),
    ("f32/int8", "float32", "int8", False, None),
    ("f32/int8 before", "float32", "int8", True, None),
    ("bf16/int8", "bfloat16", "int8", False, None),
    ("bf16/int8 before", "bfloat16", "int8", True, None),
)
PAIRS = (
    ("f32/f32", "f32/f32 gathered"),
    ("f32/bf16", "f32/f32"),
    ("f32/f16", "f32/f32"),
    ("bf16/bf16", "bf16/bf16 gathered"),
    ("f32/int8", "f32/int8 before"),
    ("bf16/int8", "bf16/int8 before"),
    ("bf16/bf16", "f32/f32"),
    ("f32/int8", "f32/f32"),
)


def spread(values: Sequence[float], fmt: str = ".2f") -> str:
    """``median (min to max)``."""
    mid = percentile(list(values), 50)
    return f"{mid:{fmt}} ({min(values):{fmt}} to {max(values):{fmt}})"


def compare(args: argparse.Namespace) -> dict[str, object]:
    """16 streams in every configuration of ``COMPARED``, alternated rounds; prints a table."""
    import yieldgate.harness.model as model_module

    top = max(CONCURRENCY)
    models = {
        dtype: Engine(EngineConfig(device=args.device, num_blocks=1, dtype=dtype)).model
        for dtype in ("float32", "bfloat16")
    }
    per_token = flops_per_token(models["float32"], args.prompt_tokens + args.max_tokens / 2)
    runs: dict[str, list[Run]] = {label: [] for label, *_ in COMPARED}
    shares: dict[str, list[float]] = {label: [] for label, *_ in COMPARED}
    gflops: dict[str, list[float]] = {dtype: [] for dtype in models}
    for round_no in range(args.rounds):
        for dtype, model in models.items():
            gflops[dtype].append(matmul_gflops(model))
        order = COMPARED if round_no % 2 == 0 else tuple(reversed(COMPARED))
        for label, dtype, kv_dtype, before, resident in order:
            model_module.INT8_BEFORE_ISSUE_42 = before
            options = {"dtype": dtype, "kv_dtype": kv_dtype, "resident": resident}
            try:
                run = run_once(top, argparse.Namespace(**{**vars(args), **options}))
            finally:
                model_module.INT8_BEFORE_ISSUE_42 = False
            runs[label].append(run)
            shares[label].append(run.tokens_per_s * per_token / (gflops[dtype][-1] * 1e9))
    print(
        f"harness decode, --compare: {top} streams, {args.rounds} alternated rounds, "
        f"{args.clock} clock, prompts of "
        f"{args.prompt_tokens} tokens, {args.max_tokens} tokens each, {args.threads} torch "
        f"thread(s), torch {torch.__version__}, {platform.processor() or platform.machine()}"
    )
    for dtype, values in gflops.items():
        print(f"matmul roofline, {dtype}: {spread(values, '.1f')} GFLOP/s")
    print(f"{'model/KV':<17} {'tokens/s':>24} {'ms per step':>22} {'roofline share':>22}")
    for label, *_ in COMPARED:
        tps = [r.tokens_per_s for r in runs[label]]
        ms = [r.step_ms for r in runs[label]]
        print(f"{label:<17} {spread(tps, ',.0f'):>24} {spread(ms):>22} {spread(shares[label]):>22}")
    ratios = {}
    for a, b in PAIRS:
        paired = [x.tokens_per_s / y.tokens_per_s for x, y in zip(runs[a], runs[b], strict=True)]
        ratios[f"{a} vs {b}"] = paired
        print(f"tokens/s, {a} vs {b}, paired per round: {spread(paired)}")
    return {
        "gflops": gflops,
        "shares": shares,
        "ratios": ratios,
        "runs": {label: [asdict(r) for r in rs] for label, rs in runs.items()},
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--kv-blocks", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="the model's dtype (default float32)",
    )
    parser.add_argument(
        "--kv-dtype",
        default="auto",
        choices=("auto", "int8", "bfloat16", "float16"),
        help=(
            "KV cache storage: auto (the model's dtype, default), int8, or bfloat16 or float16 "
            "for a float32 model"
        ),
    )
    parser.add_argument("--profile", action="store_true", help="also profile one 16-stream decode")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="16 streams in every model/KV dtype, int8 also by its path before issue 42",
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--gather",
        dest="resident",
        action="store_const",
        const=False,
        default=None,
        help="gather each decode step's context from the paged cache (resident_kv=False)",
    )
    parser.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="time by wall time (default) or this thread's CPU time (steadier when shared)",
    )
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    global clock
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if smoke(args):
        args.rounds, args.prompt_tokens, args.max_tokens, args.kv_blocks = 1, 8, 8, 64
    if args.rounds < 1:
        raise ValueError(f"--rounds must be >= 1, got {args.rounds}")
    torch.set_num_threads(args.threads)
    if args.compare:
        result = compare(args)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"args": vars(args), **result}, f, indent=2)
        return 0

    probe = Engine(
        EngineConfig(device=args.device, num_blocks=1, dtype=args.dtype, kv_dtype=args.kv_dtype)
    )
    device, model = probe.device, probe.model
    runs: dict[int, list[Run]] = {n: [] for n in CONCURRENCY}
    gflops: list[float] = []
    for round_no in range(args.rounds):
        order = CONCURRENCY if round_no % 2 == 0 else tuple(reversed(CONCURRENCY))
        for streams in order:
            runs[streams].append(run_once(streams, args))
            if streams == max(CONCURRENCY):
                gflops.append(matmul_gflops(model))

    print(
        f"harness decode, {args.rounds} rounds, prompts of {args.prompt_tokens} tokens, "
        f"{args.max_tokens} tokens each, device {device}, dtype {args.dtype}, "
        f"KV {args.kv_dtype}, {args.threads} torch thread(s), "
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

    context = args.prompt_tokens + args.max_tokens / 2
    per_token = flops_per_token(model, context)
    top = max(CONCURRENCY)
    shares = [
        r.tokens_per_s * per_token / (g * 1e9) for r, g in zip(runs[top], gflops, strict=True)
    ]
    share = percentile(shares, 50)
    peak = percentile(gflops, 50)
    verdict = "met" if share >= GOAL_ROOFLINE else "NOT met"
    print(
        f"roofline: {per_token / 1e6:.2f} MFLOP per token (mean context {context:.0f}); "
        f"F.linear, {ROOFLINE_ROWS} rows through the model's weights, one thread: "
        f"{peak:.1f} GFLOP/s (rounds {min(gflops):.1f}-{max(gflops):.1f}); "
        f"{top} streams reach {medians[top] * per_token / 1e9:.1f} GFLOP/s"
    )
    print(
        f"share of the roofline at {top} streams: {share:.2f} "
        f"(rounds {min(shares):.2f}-{max(shares):.2f}; goal >= {GOAL_ROOFLINE}: {verdict})"
    )
    if args.profile:
        profile_decode(args)
    if args.json:
        payload = {
            "device": str(device),
            "dtype": args.dtype,
            "kv_dtype": args.kv_dtype,
            "threads": args.threads,
            "prompt_tokens": args.prompt_tokens,
            "max_tokens": args.max_tokens,
            "tokens_per_s": {str(n): medians[n] for n in CONCURRENCY},
            "step_ms": {str(n): step_ms[n] for n in CONCURRENCY},
            "ratio_16_vs_1": ratio,
            "flops_per_token": per_token,
            "matmul_gflops": gflops,
            "roofline_share": share,
            "roofline_shares": shares,
            "runs": {str(n): [asdict(r) for r in runs[n]] for n in CONCURRENCY},
        }
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Measurement: how far half-precision speculative greedy output departs from plain decoding.

What it measures. For each speculative setting (``k`` of 1, 4 and 7, and 3
with branches), an engine in ``--dtype`` (bfloat16 by default) decodes a
fixed set of prompts, one at a time and ``--batch`` side by side, and a
plain engine in the same dtype decodes them the same way, asking for its
top-2 log-probabilities (which do not change what it decodes). Reported:
the share of tokens identical position by position, the share before each
sequence's first departure, and, at every departure, the margin between
plain decoding's two best logits (0 is an exact tie) and whether the
speculated token was one of those two. Not a timing: nothing here depends
on the machine's load. int8 KV's next-token agreement with the float cache
is reported too (``kv_quality.measure_agreement``), in this dtype and in
float32.

Run it (from the repository root)::

    .venv/bin/python bench/harness_half.py
    .venv/bin/python bench/harness_half.py --dtype float16 --max-tokens 64
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

from _common import add_smoke_flag, smoke
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.kv_quality import measure_agreement
from yieldgate.harness.sequence import SamplingParams
from yieldgate.harness.speculative import SpeculativeConfig

PROMPTS = [
    b"Hi",
    b"The quick brown fox jumps over the lazy dog",
    b"0123456789abcdef",
    b"a longer prompt that spans several KV blocks of sixteen tokens each, and then some",
    b"stream 007: ",
    b"def main():\n    ",
    b"SELECT * FROM",
    b"<html><body>",
    b"1 2 3 4 5 6",
    b"x",
]
QUICK = {"distill_steps": 30, "distill_sequences": 4, "distill_tokens": 16}
SETTINGS = {
    "k1-naive": SpeculativeConfig(k=1, distill_steps=0),
    "k4": SpeculativeConfig(k=4, **QUICK),
    "k7-3layers": SpeculativeConfig(k=7, draft_layers=3, **QUICK),
    "k3-branches": SpeculativeConfig(k=3, branch_threshold=1.0, max_extra_tokens=2, **QUICK),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dtype", default="bfloat16", help="bfloat16 (default) or float16")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--batch", type=int, default=5, help="prompts side by side (default 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    add_smoke_flag(parser)
    args = parser.parse_args(argv)
    if smoke(args):
        args.max_tokens, args.batch = 4, 2
    torch.set_num_threads(args.threads)
    base = {"device": "cpu", "num_blocks": 512, "dtype": args.dtype}
    prompts = [list(p) for p in PROMPTS]
    asking = SamplingParams(max_tokens=args.max_tokens, logprobs=2)
    greedy = SamplingParams(max_tokens=args.max_tokens)
    total = same = before = 0
    margins: list[float] = []
    print(f"harness half precision: {args.dtype}, {len(prompts)} prompts, {args.max_tokens} tokens")
    for name, spec in SETTINGS.items():
        speculated = Engine(EngineConfig(**base, speculative=spec))
        for batch in sorted({1, args.batch}):
            plain = Engine(EngineConfig(**base))
            for lo in range(0, len(prompts), batch):
                chunk = prompts[lo : lo + batch]
                seqs = [plain.add(prompt, asking) for prompt in chunk]
                plain.run_until_done(seqs)
                outs = speculated.generate(chunk, greedy)
                for seq, out in zip(seqs, outs, strict=True):
                    pairs = list(zip(seq.output, out, strict=True))
                    at = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
                    total += len(pairs)
                    same += sum(a == b for a, b in pairs)
                    before += len(pairs) if at is None else at
                    if at is not None:
                        (first, lp1), (second, lp2) = seq.logprobs[at].top[:2]
                        margins.append(lp1 - lp2)
                        head = bytes(seq.tokens[: min(12, seq.num_prompt)])
                        print(
                            f"  {name} batch {batch} {head!r}: departs at "
                            f"{at}, margin {lp1 - lp2:.4f}, "
                            f"one of the two best: {out[at] in (first, second)}"
                        )
    print(f"identical position by position: {same / total:.3f} of {total} tokens")
    print(f"identical before the first departure: {before / total:.3f}")
    ties = sum(m == 0 for m in margins)
    print(
        f"departures: {len(margins)}, exact ties {ties}, largest margin {max(margins, default=0)}"
    )
    for dtype in (args.dtype, "float32"):
        plain = Engine(EngineConfig(device="cpu", num_blocks=256, dtype=dtype))
        int8 = Engine(EngineConfig(device="cpu", num_blocks=256, dtype=dtype, kv_dtype="int8"))
        agreement = measure_agreement(plain, int8, max_tokens=args.max_tokens)
        print(f"int8 KV next-token agreement, {dtype}: {agreement.next_token:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

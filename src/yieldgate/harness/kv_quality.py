"""What a compressed KV cache costs: greedy outputs against an uncompressed reference.

Two engines over the same weights run the same fixed prompts greedily; the
candidate (say, int8 KV) is scored against the reference (float32 KV) three ways:

- ``next_token``: teacher-forced agreement. The candidate decodes with the
  reference's tokens fed back (each step's sampled token is replaced by the
  reference's before the next step), and each step counts whether its own
  greedy choice matched. It measures the cache's error at every position
  without letting one early flip decide everything after it.
- ``exact_match``: the share of prompts whose free-running outputs are identical.
- ``prefix``: the mean share of each output before the first differing token.
"""

from __future__ import annotations

from dataclasses import dataclass

from yieldgate.harness.engine import Engine
from yieldgate.harness.sequence import SamplingParams, Sequence

__all__ = ["AGREEMENT_PROMPTS", "KVAgreement", "measure_agreement"]

# A fixed, varied prompt set (prose, code, markup, digits, one byte).
AGREEMENT_PROMPTS: tuple[str, ...] = (
    "Hello",
    "The quick brown fox jumps over the lazy dog",
    "def main():\n    return 0\n",
    "SELECT name FROM users WHERE id = 42;",
    "Once upon a time, in a land far away, there lived",
    "0123456789abcdef" * 4,
    "yieldgate: client-side backpressure for LLM endpoints",
    "Q: what is 2 + 2?\nA:",
    "<html><body><p>hi</p></body></html>",
    "lorem ipsum dolor sit amet, consectetur",
    "GET /v1/completions HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "The KV cache grows with every token.",
    "a",
    "!!!???...",
    "Paged attention splits the cache into blocks of sixteen tokens.",
    "zzzz",
)


@dataclass(frozen=True, slots=True)
class KVAgreement:
    """How closely a candidate engine's greedy outputs follow the reference's."""

    next_token: float
    exact_match: float
    prefix: float
    num_prompts: int
    max_tokens: int


def measure_agreement(
    reference: Engine,
    candidate: Engine,
    prompts: list[list[int]] | None = None,
    max_tokens: int = 64,
) -> KVAgreement:
    """Score ``candidate`` against ``reference`` on ``prompts`` (``AGREEMENT_PROMPTS`` if none)."""
    if prompts is None:
        prompts = [list(text.encode()) for text in AGREEMENT_PROMPTS]
    if not prompts:
        raise ValueError("measure_agreement needs at least one prompt")
    params = SamplingParams(max_tokens=max_tokens)
    expected = reference.generate(prompts, params)
    free = candidate.generate(prompts, params)
    exact = sum(a == b for a, b in zip(expected, free, strict=True)) / len(prompts)
    prefix = sum(_common_prefix(a, b) for a, b in zip(expected, free, strict=True))
    return KVAgreement(
        next_token=_teacher_forced(candidate, prompts, expected, params),
        exact_match=exact,
        prefix=prefix / (len(prompts) * max_tokens),
        num_prompts=len(prompts),
        max_tokens=max_tokens,
    )


def _teacher_forced(
    engine: Engine, prompts: list[list[int]], expected: list[list[int]], params: SamplingParams
) -> float:
    seqs = [engine.add(prompt, params) for prompt in prompts]
    wanted: dict[Sequence, list[int]] = dict(zip(seqs, expected, strict=True))
    hits = total = 0
    while not all(seq.is_finished for seq in seqs):
        result = engine.step()
        if result is None:
            raise RuntimeError("the engine stalled")
        for seq, token in zip(result.seqs, result.tokens, strict=True):
            want = wanted[seq][seq.num_output - 1]
            hits += token == want
            total += 1
            # The new token's KV is computed in the next step, so it can still be swapped.
            seq.tokens[-1] = want
    return hits / total


def _common_prefix(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return i
    return len(a)

"""Chunked prefill (``SchedulerConfig.prefill_chunk``): a prompt computed a piece a step.

What it is for: a long prompt on an engine that is decoding holds the decoding
sequences (and a high one whose KV has just arrived) up for one piece at a
time, not for its whole prefill. What it must not change: the tokens, the
log-probabilities, the prefix cache, preemption, abort.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import run_cli
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, SequenceStatus
from yieldgate.protocol import Priority

pytest.importorskip("torch")

PROMPTS = [
    list(b"Hi"),
    list(b"The quick brown fox jumps over the lazy dog"),
    list(b"0123456789abcdef"),  # exactly one block of 16
    list(b"a longer prompt that spans several KV blocks of sixteen tokens each, and then some"),
]
LONG = list(b"a prompt of two hundred bytes, computed in pieces. " * 4)[:200]


def make_engine(chunk: int = 0, **overrides: Any) -> Engine:
    scheduler = SchedulerConfig(prefill_chunk=chunk, **overrides.pop("scheduler", {}))
    return Engine(
        EngineConfig(**{"device": "cpu", "num_blocks": 256, "scheduler": scheduler, **overrides})
    )


@pytest.mark.parametrize("chunk", [1, 7, 16, 33])
def test_chunked_greedy_outputs_equal_the_full_forward_pass(chunk: int) -> None:
    engine = make_engine(chunk)
    outputs = engine.generate([*PROMPTS, LONG], SamplingParams(max_tokens=12))
    model = engine.model
    assert outputs == [model.greedy_reference(p, 12) for p in [*PROMPTS, LONG]]
    # Computed in pieces: the long prompt alone needs ceil(200 / chunk) prefill steps.
    assert engine.num_prefill_steps >= -(-len(LONG) // chunk)
    assert engine.blocks.stats().num_used == 0


def test_sampling_and_logprobs_are_those_of_a_whole_prefill() -> None:
    """A piece draws no token: a seeded draw and its log-probabilities are unchanged."""
    params = SamplingParams(max_tokens=10, temperature=0.8, seed=5, logprobs=3)
    runs = []
    for chunk in (0, 9):
        engine = make_engine(chunk)
        seqs = [engine.add(prompt, params) for prompt in (LONG, PROMPTS[3])]
        engine.run_until_done(seqs)
        runs.append([(seq.output, [(lp.token, lp.logprob) for lp in seq.logprobs]) for seq in seqs])
    whole, chunked = runs
    assert [out for out, _ in chunked] == [out for out, _ in whole]
    for (_, got), (_, want) in zip(chunked, whole, strict=True):
        assert len(got) == len(want) == 10
        for (token, lp), (want_token, want_lp) in zip(got, want, strict=True):
            assert token == want_token
            assert lp == pytest.approx(want_lp, abs=1e-4)


def test_pieces_alternate_with_decode_steps_and_give_no_token() -> None:
    engine = make_engine(32)
    decoding = [engine.add(p, SamplingParams(max_tokens=60)) for p in PROMPTS[:2]]
    while not all(seq.num_output for seq in decoding):  # the 43-token one in two pieces
        engine.step()
    long = engine.add(LONG, SamplingParams(max_tokens=3))
    kinds = []
    while long.num_output == 0:
        step = engine.step()
        assert step is not None
        if step.is_prefill:
            kinds.append("piece" if not step.seqs else "last")
            assert step.num_new_tokens <= 32
            assert step.seqs in ([], [long])
            assert long.status in (SequenceStatus.READY, SequenceStatus.RUNNING)
        else:
            kinds.append("decode")
            assert step.seqs == decoding  # the long one does not decode before its last piece
    # 200 tokens: six pieces of 32 and a last one of 8, each after a decode step.
    assert kinds == ["piece", "decode"] * 6 + ["last"]
    assert long.prefill_tokens == len(LONG)
    engine.run_until_done([*decoding, long])
    assert long.output == engine.model.greedy_reference(LONG, 3)
    assert all(
        s.output == engine.model.greedy_reference(p, 60)
        for s, p in zip(decoding, PROMPTS[:2], strict=True)
    )


def test_a_high_request_is_prefilled_between_a_low_prompts_pieces() -> None:
    engine = make_engine(16)
    low = engine.add(LONG, SamplingParams(max_tokens=4), priority=Priority.LOW)
    engine.step()  # its first piece
    assert low.status is SequenceStatus.READY
    high = engine.add(list(b"urgent"), SamplingParams(max_tokens=4), priority=Priority.HIGH)
    step = engine.step()
    assert step is not None
    assert step.is_prefill
    assert step.seqs == [high]  # its first token now; the low one got its second piece
    assert low.num_computed == 32
    assert low.num_output == 0
    engine.run_until_done([low, high])
    assert low.output == engine.model.greedy_reference(LONG, 4)


def test_the_prefix_cache_keeps_a_chunked_prompts_blocks() -> None:
    engine = make_engine(10)
    first = engine.add(LONG, SamplingParams(max_tokens=2))
    engine.run_until_done([first])
    again = engine.add(LONG[:180] + list(b"other end"), SamplingParams(max_tokens=2))
    engine.run_until_done([again])
    assert again.prefix_hit_tokens == 176  # the eleven full blocks of the shared 180 tokens
    assert again.output == engine.model.greedy_reference(LONG[:180] + list(b"other end"), 2)


def test_kv_exhaustion_with_pieces_preempts_and_every_request_completes() -> None:
    engine = make_engine(8, num_blocks=12)
    outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=24))
    assert engine.scheduler.num_preemptions > 0
    assert outputs == [engine.model.greedy_reference(p, 24) for p in PROMPTS]
    assert engine.blocks.stats().num_used == 0


def test_aborting_between_pieces_frees_the_blocks() -> None:
    engine = make_engine(16)
    seq = engine.add(LONG, SamplingParams(max_tokens=4))
    engine.step()
    assert seq.status is SequenceStatus.READY
    assert engine.blocks.stats().num_used > 0
    engine.abort(seq)
    assert engine.blocks.stats().num_used == 0
    assert not engine.has_work


def test_the_chunk_is_validated() -> None:
    for bad in (-1, 2.5, True, "8"):
        with pytest.raises(ValueError, match="prefill_chunk"):
            SchedulerConfig(prefill_chunk=bad)  # type: ignore[arg-type]


def test_the_cli_names_the_flag_of_a_bad_chunk() -> None:
    result = run_cli("serve", "--backend", "harness", "--prefill-chunk", "-4")
    assert result.returncode == 2
    assert "--prefill-chunk must be an integer >= 0" in result.stderr
    assert "Traceback" not in result.stderr

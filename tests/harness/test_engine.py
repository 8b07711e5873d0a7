"""The engine against the ground truth: greedy tokens from full forward passes."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence

PROMPTS = [
    list(b"Hi"),
    list(b"The quick brown fox jumps over the lazy dog"),
    list(b"0123456789abcdef"),  # exactly one block of 16
    list(b"a longer prompt that spans several KV blocks of sixteen tokens each, and then some"),
]


def make_engine(**overrides: Any) -> Engine:
    return Engine(EngineConfig(**{"device": "cpu", "num_blocks": 256, **overrides}))


@pytest.fixture(scope="module")
def references() -> list[list[int]]:
    model = make_engine().model
    return [model.greedy_reference(prompt, 24) for prompt in PROMPTS]


def test_cached_greedy_equals_full_forward_greedy(references: list[list[int]]) -> None:
    engine = make_engine()
    for prompt, expected in zip(PROMPTS, references, strict=True):
        assert engine.generate([prompt], SamplingParams(max_tokens=24)) == [expected]


def test_a_sequence_decoded_in_a_batch_equals_it_decoded_alone(
    references: list[list[int]],
) -> None:
    engine = make_engine()
    outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=24))
    assert outputs == references
    # They really were batched: one prefill step, then decode steps of four.
    assert engine.num_prefill_steps == 1
    assert engine.num_decode_steps == 23


def test_prefix_caching_computes_only_the_new_tokens() -> None:
    engine = make_engine()
    system = list(b"You are a terse assistant. Answer in one line. " * 4)  # 196 tokens
    first = engine.add(system + list(b"Question one?"), SamplingParams(max_tokens=4))
    engine.run_until_done([first])
    assert first.prefix_hit_tokens == 0
    computed_before = engine.prompt_tokens_computed
    second_prompt = system + list(b"And a second question?")
    second = engine.add(second_prompt, SamplingParams(max_tokens=4))
    engine.run_until_done([second])
    shared_blocks = len(system) // 16  # full blocks of the shared prefix
    assert second.prefix_hit_tokens == shared_blocks * 16
    assert (
        engine.prompt_tokens_computed - computed_before == len(second_prompt) - shared_blocks * 16
    )
    assert engine.prefix_hit_tokens == shared_blocks * 16
    # And the cached KV gives the same tokens as computing everything.
    assert second.output == engine.model.greedy_reference(second_prompt, 4)


def test_a_request_arriving_mid_flight_starts_before_earlier_ones_finish() -> None:
    engine = make_engine()
    early = [engine.add(prompt, SamplingParams(max_tokens=40)) for prompt in PROMPTS[:2]]
    for _ in range(5):
        engine.step()
    late = engine.add(list(b"late arrival"), SamplingParams(max_tokens=3))
    step = engine.step()
    assert step is not None
    assert step.is_prefill
    assert step.seqs == [late]
    assert late.num_output == 1
    # The late one finishes while the early ones are still generating.
    while not late.is_finished:
        engine.step()
    assert all(not seq.is_finished for seq in early)
    assert all(0 < seq.num_output < 40 for seq in early)
    engine.run_until_done(early)
    assert late.output == engine.model.greedy_reference(list(b"late arrival"), 3)


def test_kv_exhaustion_preempts_and_every_request_completes_correctly(
    references: list[list[int]],
) -> None:
    # 12 blocks of 16 tokens for 4 sequences that grow to 26-108 tokens: they cannot
    # all hold their KV at once.
    engine = make_engine(num_blocks=12)
    outputs = engine.generate(PROMPTS, SamplingParams(max_tokens=24))
    assert engine.scheduler.num_preemptions > 0
    assert outputs == references
    assert engine.blocks.stats().num_used == 0


def test_max_num_seqs_and_token_budget_bound_a_prefill_step() -> None:
    engine = make_engine(scheduler=SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=90))
    seqs = [engine.add(prompt, SamplingParams(max_tokens=2)) for prompt in PROMPTS]
    first = engine.step()
    assert first is not None
    assert first.is_prefill
    assert first.seqs == seqs[:2]  # max_num_seqs
    engine.run_until_done(seqs[:2])
    second = engine.step()
    # 16 + 82 tokens exceed the 90-token budget: the second waits for the next step.
    assert second is not None
    assert second.seqs == [seqs[2]]
    engine.run_until_done(seqs)


def test_sampling_with_a_seed_repeats() -> None:
    engine = make_engine()
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=7)
    a = engine.generate([PROMPTS[1]], params)
    b = engine.generate([PROMPTS[1]], params)
    other = engine.generate([PROMPTS[1]], SamplingParams(max_tokens=16, temperature=1.0, seed=8))
    assert a == b
    assert a != other


def test_abort_frees_the_blocks_at_once() -> None:
    engine = make_engine()
    seq = engine.add(PROMPTS[3], SamplingParams(max_tokens=50))
    engine.step()
    engine.step()
    assert engine.blocks.stats().num_used > 0
    engine.abort(seq)
    assert engine.blocks.stats().num_used == 0
    assert not engine.has_work
    waiting = engine.add(PROMPTS[0], SamplingParams(max_tokens=5))
    engine.abort(waiting)
    assert not engine.has_work


def test_requests_that_can_never_run_are_refused_up_front() -> None:
    engine = make_engine(
        model=ModelConfig(max_seq_len=64), scheduler=SchedulerConfig(max_num_batched_tokens=32)
    )
    with pytest.raises(ValueError, match="positions"):
        engine.add(list(b"x" * 30), SamplingParams(max_tokens=40))
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        engine.add(list(b"x" * 33), SamplingParams(max_tokens=1))
    small = make_engine(num_blocks=2)
    with pytest.raises(ValueError, match="KV blocks"):
        small.add(list(b"x" * 30), SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=float("nan"))


def test_a_request_that_fits_exactly_is_run_not_refused() -> None:
    # The last token is sampled, never fed back: prompt + max_tokens - 1 positions and KV slots.
    engine = make_engine(model=ModelConfig(max_seq_len=64), num_blocks=4)  # 64 slots too
    prompt = list(b"x" * 30)
    with pytest.raises(ValueError, match="positions"):
        engine.add(prompt, SamplingParams(max_tokens=36))
    seq = engine.add(prompt, SamplingParams(max_tokens=35))
    engine.run_until_done([seq])
    assert seq.output == engine.model.greedy_reference(prompt, 35)
    small = make_engine(num_blocks=2)  # 32 slots, positions to spare
    with pytest.raises(ValueError, match="KV blocks"):
        small.add(prompt, SamplingParams(max_tokens=4))
    seq = small.add(prompt, SamplingParams(max_tokens=3))
    small.run_until_done([seq])
    assert seq.output == small.model.greedy_reference(prompt, 3)
    assert engine.blocks.stats().num_used == small.blocks.stats().num_used == 0


def test_stats_count_the_work() -> None:
    engine = make_engine()
    engine.generate(PROMPTS[:2], SamplingParams(max_tokens=5))
    stats = engine.stats()
    assert stats["tokens_generated"] == 10
    assert stats["prompt_tokens_computed"] == len(PROMPTS[0]) + len(PROMPTS[1])
    assert stats["prefill_steps"] == 1
    assert stats["decode_steps"] == 4
    assert stats["kv_blocks_used"] == 0
    assert engine.estimate_ms(100, 10) is not None


def test_a_few_token_prefill_does_not_move_the_per_token_average() -> None:
    # A prefix hit computes the prompt's last token only, as a prompt whose KV came
    # from a prefill worker does: per token, that step's fixed cost would price
    # every prompt as many times slower (the Governor's hints, from estimate_ms).
    engine = make_engine()
    prompt = list(b"three blocks of sixteen tokens, and one token more"[:49])
    engine.generate([prompt], SamplingParams(max_tokens=1))
    average = engine.prefill_ms_per_token
    assert average is not None
    engine.generate([prompt], SamplingParams(max_tokens=1))
    assert engine.stats()["prefix_hit_tokens"] == 48  # whole blocks: the last token is computed
    assert engine.prefill_ms_per_token == average
    engine.generate([prompt[::-1]], SamplingParams(max_tokens=1))  # uncached: it counts
    assert engine.prefill_ms_per_token != average


def test_estimates_count_a_decode_step_between_chunk_pieces() -> None:
    engine = make_engine(scheduler=SchedulerConfig(prefill_chunk=16))
    engine.prefill_ms_per_token, engine.decode_step_ms = 0.5, 3.0
    alone = engine.estimate_ms(64, 1, steps_ahead=0, decoding=False)
    assert alone == 64 * 0.5
    # Four pieces while others decode: three decode steps between them.
    assert engine.estimate_ms(64, 1, steps_ahead=0, decoding=True) == 64 * 0.5 + 3 * 3.0
    assert engine.estimate_ms(65, 1, steps_ahead=0, decoding=True) == 65 * 0.5 + 4 * 3.0
    # Prefilled at a worker, in one step.
    assert engine.estimate_ms(64, 1, steps_ahead=0, decoding=True, on_engine=False) == alone
    assert engine.estimate_ms(64, 1, steps_ahead=0) == alone  # nothing runs
    seq = engine.add(list(b"x" * 20), SamplingParams(max_tokens=8))
    while not seq.output:  # two pieces, then it decodes
        engine.step()
    engine.prefill_ms_per_token, engine.decode_step_ms = 0.5, 3.0  # the steps moved them
    assert engine.estimate_ms(64, 1, steps_ahead=0) == 64 * 0.5 + 3 * 3.0


def reference_logprobs(engine: Engine, seq: Sequence, temperature: float) -> torch.Tensor:
    """``log_softmax(logits / T)`` at every output position, by one full forward pass."""
    logits = engine.model.forward_full(torch.tensor(seq.tokens[:-1]))
    return torch.log_softmax(logits[seq.num_prompt - 1 :].float() / temperature, dim=-1)


def assert_logprobs_match(engine: Engine, seq: Sequence, temperature: float, top: int) -> None:
    expected = reference_logprobs(engine, seq, temperature)
    assert [entry.token for entry in seq.logprobs] == seq.output
    for position, entry in enumerate(seq.logprobs):
        row = expected[position]
        assert entry.logprob == pytest.approx(float(row[entry.token]), abs=1e-4)
        values, ids = row.topk(top)
        assert [token for token, _ in entry.top] == ids.tolist()
        assert [value for _, value in entry.top] == pytest.approx(values.tolist(), abs=1e-4)


def test_greedy_logprobs_equal_a_full_forward_pass_in_a_batch_with_others() -> None:
    engine = make_engine()
    asking = engine.add(PROMPTS[1], SamplingParams(max_tokens=12, logprobs=5))
    silent = [engine.add(p, SamplingParams(max_tokens=12)) for p in (PROMPTS[0], PROMPTS[3])]
    no_top = engine.add(PROMPTS[2], SamplingParams(max_tokens=12, logprobs=0))
    engine.run_until_done([asking, no_top, *silent])
    assert_logprobs_match(engine, asking, 1.0, 5)
    assert_logprobs_match(engine, no_top, 1.0, 0)
    # Greedy picks the most likely token: it heads its own alternatives.
    assert all(entry.top[0][0] == entry.token for entry in asking.logprobs)
    assert all(seq.logprobs == [] for seq in silent)
    # Asking for log-probabilities changes no token.
    alone = make_engine().generate([PROMPTS[1]], SamplingParams(max_tokens=12))[0]
    assert asking.output == alone


def test_sampled_logprobs_are_of_the_tempered_distribution() -> None:
    engine = make_engine()
    params = SamplingParams(max_tokens=16, temperature=0.8, seed=7, logprobs=3)
    asking = engine.add(PROMPTS[3], params)
    other = engine.add(PROMPTS[0], SamplingParams(max_tokens=16, temperature=1.3, seed=1))
    engine.run_until_done([asking, other])
    assert_logprobs_match(engine, asking, 0.8, 3)
    assert other.logprobs == []
    quiet = SamplingParams(max_tokens=16, temperature=0.8, seed=7)
    assert make_engine().generate([PROMPTS[3]], quiet)[0] == asking.output


def test_top_p_samples_from_the_nucleus_and_repeats_with_a_seed() -> None:
    params = SamplingParams(max_tokens=24, temperature=1.5, seed=11, top_p=0.5, logprobs=0)
    engine = make_engine()
    seq = engine.add(PROMPTS[1], params)
    engine.run_until_done([seq])
    probs = reference_logprobs(engine, seq, 1.5).exp()
    for position, token in enumerate(seq.output):
        row = probs[position]
        more_likely = float(row[row > row[token]].sum())
        assert more_likely < 0.5  # inside the smallest set of mass 0.5
    assert make_engine().generate([PROMPTS[1]], params) == [seq.output]
    # A tiny top_p leaves only the most likely token: greedy.
    tiny = SamplingParams(max_tokens=24, temperature=1.5, seed=3, top_p=1e-6)
    assert (
        make_engine().generate([PROMPTS[1]], tiny)[0]
        == make_engine().generate([PROMPTS[1]], SamplingParams(max_tokens=24))[0]
    )


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_sampling_params_refuse_bad_top_p_and_logprobs(
    overrides: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        SamplingParams(**overrides)

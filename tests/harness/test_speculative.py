"""Speculative decoding: exact under greedy decoding, counted, bounded, rolled back."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence
from yieldgate.harness.speculative import SpeculativeConfig

PROMPTS = [
    list(b"Hi"),
    list(b"The quick brown fox jumps over the lazy dog"),
    list(b"0123456789abcdef"),  # exactly one block of 16
    list(b"a longer prompt that spans several KV blocks of sixteen tokens each, and then some"),
    list(b"stream 007: "),
]
MAX_TOKENS = 32
# A quick distillation: the tests are about exactness, not acceptance.
QUICK = {"distill_steps": 30, "distill_sequences": 4, "distill_tokens": 16}


def make_engine(speculative: SpeculativeConfig | None = None, **overrides: Any) -> Engine:
    config = {"device": "cpu", "num_blocks": 256, "speculative": speculative, **overrides}
    return Engine(EngineConfig(**config))


@pytest.fixture(scope="module")
def references() -> list[list[int]]:
    """Plain decoding, all prompts side by side."""
    return make_engine().generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS))


@pytest.mark.parametrize(
    "spec",
    [
        SpeculativeConfig(k=1, distill_steps=0),
        SpeculativeConfig(k=2, draft_layers=0, **QUICK),
        SpeculativeConfig(k=4, **QUICK),
        SpeculativeConfig(k=7, draft_layers=3, **QUICK),
        # Branch wherever it can, two branch rows per step at most.
        SpeculativeConfig(k=3, branch_threshold=1.0, max_extra_tokens=2, **QUICK),
    ],
    ids=["k1-naive", "k2-0layers", "k4", "k7-3layers", "k3-branches"],
)
@pytest.mark.parametrize("batch", [1, 5])
def test_greedy_output_is_identical_with_speculation(
    references: list[list[int]], spec: SpeculativeConfig, batch: int
) -> None:
    engine = make_engine(spec)
    outputs: list[list[int]] = []
    for start in range(0, len(PROMPTS), batch):
        chunk = PROMPTS[start : start + batch]
        outputs += engine.generate(chunk, SamplingParams(max_tokens=MAX_TOKENS))
    assert outputs == references
    stats = engine.stats()
    assert stats["spec_drafted"] > 0
    assert stats["tokens_generated"] == len(PROMPTS) * MAX_TOKENS
    # Every KV block, lookahead and scratch included, went back.
    assert stats["kv_blocks_used"] == 0


def test_branches_are_verified_bounded_and_sometimes_win(references: list[list[int]]) -> None:
    spec = SpeculativeConfig(k=3, branch_threshold=1.0, max_extra_tokens=2, **QUICK)
    engine = make_engine(spec)
    assert engine.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS)) == references
    stats = engine.stats()
    assert stats["spec_branches"] > 0
    assert stats["spec_extra_tokens"] == stats["spec_branches"]
    assert stats["spec_branches"] <= 2 * stats["spec_steps"]
    # A win keeps the branch token (its KV copied into the sequence) and the one after:
    # exactness above covers that path only if it ran.
    assert stats["spec_branch_hits"] > 0


def test_counters_add_up() -> None:
    engine = make_engine(SpeculativeConfig(k=4, **QUICK))
    engine.generate(PROMPTS[:3], SamplingParams(max_tokens=MAX_TOKENS))
    stats = engine.stats()
    assert 0 < stats["spec_accepted"] <= stats["spec_drafted"]
    assert stats["spec_acceptance_rate"] == stats["spec_accepted"] / stats["spec_drafted"]
    assert stats["spec_branches"] == stats["spec_extra_tokens"] == 0  # threshold 0: never
    assert stats["spec_steps"] == stats["decode_steps"]
    # Three sequences, the first token of each from the prefill step.
    decoded = 3 * (MAX_TOKENS - 1)
    assert stats["spec_tokens_per_seq_step"] > 1.0
    assert stats["spec_accepted"] + stats["spec_steps"] * 3 >= decoded
    # The distilled exit head agrees with the target more than the target's own head did.
    report = engine.speculator.distillation  # type: ignore[union-attr]
    assert report["agreement_after"] > report["agreement_before"]
    engine.reset_counters()
    assert engine.stats()["spec_drafted"] == 0
    assert engine.stats()["spec_acceptance_rate"] is None


def test_off_by_default_adds_no_counters() -> None:
    engine = make_engine()
    assert engine.speculator is None
    assert not any(key.startswith("spec_") for key in engine.stats())


def test_a_step_lists_a_sequence_once_per_token_in_order() -> None:
    engine = make_engine(SpeculativeConfig(k=4, **QUICK))
    seq = engine.add(PROMPTS[1], SamplingParams(max_tokens=MAX_TOKENS))
    streamed: list[int] = []
    gained_several = False
    while not seq.is_finished:
        result = engine.step()
        assert result is not None
        assert all(s is seq for s in result.seqs)
        streamed += result.tokens
        gained_several = gained_several or len(result.tokens) > 1
        # Rolled back: no block held past the tokens kept.
        if not seq.is_finished:
            assert len(seq.block_table) <= engine.blocks.blocks_for(len(seq.tokens))
            assert seq.num_computed == len(seq.tokens) - 1
    assert streamed == seq.output
    assert gained_several
    assert result.finished == [seq]


def test_exact_under_preemption_pressure() -> None:
    # 14 blocks of 16 for five sequences of up to 124 tokens: decode must preempt,
    # and the lookahead finds few or no spare blocks.
    params = SamplingParams(max_tokens=MAX_TOKENS)
    tight = {"num_blocks": 14, "scheduler": SchedulerConfig(max_num_seqs=5)}
    plain = make_engine(**tight)
    expected = plain.generate(PROMPTS, params)
    assert plain.stats()["preemptions"] > 0
    engine = make_engine(SpeculativeConfig(k=4, **QUICK), **tight)
    assert engine.generate(PROMPTS, params) == expected
    assert engine.stats()["kv_blocks_used"] == 0


def test_sampled_and_logprob_sequences_decode_plainly() -> None:
    sampled = SamplingParams(max_tokens=24, temperature=0.8, seed=7)
    logprobs = SamplingParams(max_tokens=24, logprobs=2)
    plain = make_engine()
    plain_seqs = [plain.add(PROMPTS[1], sampled), plain.add(PROMPTS[2], logprobs)]
    plain.run_until_done(plain_seqs)
    engine = make_engine(SpeculativeConfig(k=4, **QUICK))
    seqs = [
        engine.add(PROMPTS[1], sampled),
        engine.add(PROMPTS[2], logprobs),
        engine.add(PROMPTS[3], SamplingParams(max_tokens=24)),  # speculated alongside
    ]
    engine.run_until_done(seqs)
    assert [s.output for s in seqs[:2]] == [s.output for s in plain_seqs]
    assert len(seqs[1].logprobs) == 24
    for got, want in zip(seqs[1].logprobs, plain_seqs[1].logprobs, strict=True):
        assert got.token == want.token
        assert got.logprob == pytest.approx(want.logprob, abs=1e-4)
    stats = engine.stats()
    assert stats["spec_plain_rows"] >= 2 * 23
    assert stats["spec_drafted"] > 0


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"k": 0}, "k must be"),
        ({"k": 33}, "k must be"),
        ({"draft_layers": -1}, "draft_layers"),
        ({"branch_threshold": 1.5}, "branch_threshold"),
        ({"branch_threshold": -0.1}, "branch_threshold"),
        ({"max_extra_tokens": -1}, "max_extra_tokens"),
        ({"distill_steps": -1}, "distill_steps"),
        ({"distill_sequences": 0}, "distill_sequences"),
        ({"k": 2.5}, "k must be"),
    ],
)
def test_bad_config_is_refused(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig(**overrides)


def test_a_draft_as_deep_as_the_target_is_refused() -> None:
    with pytest.raises(ValueError, match="draft_layers"):
        make_engine(
            SpeculativeConfig(draft_layers=2, distill_steps=0), model=ModelConfig(n_layers=2)
        )


def test_config_is_frozen_and_keyword_only() -> None:
    config = SpeculativeConfig()
    with pytest.raises(AttributeError):
        config.k = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        SpeculativeConfig(1)  # type: ignore[misc]


def test_serve_flags_turn_speculation_on_and_refuse_bad_values() -> None:
    from yieldgate.cli import _parser
    from yieldgate.cli._serve import _harness_backend

    def engine_config(*flags: str) -> EngineConfig:
        args = _parser().parse_args(["serve", "--backend", "harness", *flags])
        config: EngineConfig = _harness_backend(args).config.engine
        return config

    assert engine_config().speculative is None
    spec = engine_config("--speculative-k", "3", "--draft-layers", "2").speculative
    assert spec == SpeculativeConfig(k=3, draft_layers=2)
    with pytest.raises(ValueError, match="k must be"):
        engine_config("--speculative-k", "-1")


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_server_backend_streams_speculated_tokens_one_chunk_each(
    anyio_backend: str,
) -> None:
    import anyio

    from yieldgate.harness.backend import HarnessBackend, HarnessConfig
    from yieldgate.server.backends import Work
    from yieldgate.server.governor import Governor, GovernorConfig

    engine = EngineConfig(device="cpu", num_blocks=64, speculative=SpeculativeConfig(k=4, **QUICK))
    harness = HarnessBackend(HarnessConfig(engine=engine))
    chunks: list[Any] = []

    async def emit(data: Any) -> None:
        chunks.append(data)

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(harness.start, Governor(GovernorConfig(max_inflight=2)))
        body = "The quick brown fox jumps over the lazy dog"
        work = Work(id="s", body=body, params={"max_tokens": 30}, stream=True)
        result = await harness.execute(work, emit)
        assert harness.engine is not None
        stats = harness.engine.stats()
    finally:
        await harness.aclose()
    expected = make_engine().generate([list(body.encode())], SamplingParams(max_tokens=30))[0]
    assert result["token_ids"] == expected
    assert [c["token_ids"][0] for c in chunks] == expected
    assert stats["spec_accepted"] > 0


def test_the_verify_grid_gives_the_full_forward_logits() -> None:
    """Two rows of several queries and a branch row, against plain causal passes."""
    import torch

    engine = make_engine(SpeculativeConfig(k=4, distill_steps=0))
    speculator = engine.speculator
    assert speculator is not None
    params = SamplingParams(max_tokens=8)
    seqs = [engine.add(PROMPTS[1], params), engine.add(PROMPTS[3], params)]
    engine.step()  # prefill: every prompt token but none of the new ones is in the cache
    extra = [list(b"xyz!"), list(b"ab")]  # stand-ins for drafts
    for seq, more in zip(seqs, extra, strict=True):
        engine.blocks.grow(seq, len(seq.tokens) + len(more))
    # Branch: the second sequence's second new token replaced by "Q".
    first = seqs[1]
    at = len(first.tokens) + 1
    spare = Sequence(-1, [0], SamplingParams())
    engine.blocks.grow(spare, 1)

    def slots_of(seq: Sequence) -> torch.Tensor:
        every = range(len(seq.block_table) * engine.config.block_size)
        return torch.tensor([speculator._slot(seq.block_table, p) for p in every])

    scratch = slots_of(spare)[:1]
    own = [slots_of(seq) for seq in seqs]
    tokens, positions, contexts, starts, cached, mapping = [], [], [], [0], [], []
    for seq, more, slots in zip(seqs, extra, own, strict=True):
        n = len(seq.tokens)
        tokens += [seq.tokens[-1], *more]
        positions += range(n - 1, n + len(more))
        contexts.append(slots[: n + len(more)])
        starts.append(starts[-1] + 1 + len(more))
        cached.append(n - 1)
        mapping.append(slots[n - 1 : n + len(more)])
    tokens.append(ord("Q"))
    positions.append(at)
    contexts.append(torch.cat((own[1][:at], scratch)))
    starts.append(starts[-1] + 1)
    cached.append(at)
    mapping.append(scratch)
    matrix = torch.nn.utils.rnn.pad_sequence(contexts, batch_first=True)
    counts = [hi - lo for lo, hi in itertools.pairwise(starts)]
    attention = speculator._grid_attention(matrix, torch.tensor(cached), counts, torch.cat(mapping))
    logits = engine.model.forward_paged(
        torch.tensor(tokens),
        torch.tensor(positions),
        engine.cache,
        attention,
        torch.arange(len(tokens)),
    )
    full = [
        engine.model.forward_full(torch.tensor(seq.tokens + more))[len(seq.tokens) - 1 :]
        for seq, more in zip(seqs, extra, strict=True)
    ]
    branch = engine.model.forward_full(torch.tensor([*first.tokens, extra[1][0], ord("Q")]))[-1:]
    torch.testing.assert_close(logits, torch.cat([*full, branch]), atol=1e-4, rtol=1e-4)


def test_speculation_refuses_int8_kv_and_keeps_exact_over_the_host_tier() -> None:
    with pytest.raises(ValueError, match="a float kv_dtype"):
        EngineConfig(speculative=SpeculativeConfig(k=4), kv_dtype="int8")
    # Pages out and in under speculation: still exactly the plain greedy output.
    tight = {"num_blocks": 14, "host_kv_blocks": 64}
    params = SamplingParams(max_tokens=MAX_TOKENS)
    reference = make_engine(None, **tight).generate(PROMPTS, params)
    engine = make_engine(SpeculativeConfig(k=4, **QUICK), **tight)
    assert engine.generate(PROMPTS, params) == reference
    stats = engine.stats()
    assert stats["kv_swap_outs"] > 0
    assert stats["kv_blocks_used"] == 0

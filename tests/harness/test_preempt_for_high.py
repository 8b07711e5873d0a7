"""A waiting high-priority sequence preempts running lower ones; nothing runs over ``max_num_seqs``.

Issue 42: a running sequence was never preempted *for* a waiting high one
(only when the KV pool ran out in a decode step), and a sequence whose KV was
back in its blocks (``ready``) did not hold a place in ``max_num_seqs``.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.kv_tiers import TieredScheduler
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence, SequenceStatus
from yieldgate.protocol import Priority

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)
LONG = SamplingParams(max_tokens=40)
SHORT = SamplingParams(max_tokens=4)


def make_engine(**overrides: Any) -> Engine:
    engine_keys = ("num_blocks", "block_size", "host_kv_blocks", "host_prefix_blocks")
    engine = {key: overrides.pop(key) for key in engine_keys if key in overrides}
    scheduler = SchedulerConfig(**{"watermark": 0.0, **overrides})
    config = {"model": SMALL, "device": "cpu", "num_blocks": 64, "block_size": 4, **engine}
    return Engine(EngineConfig(**config, scheduler=scheduler))


def prompt(n: int, length: int = 6) -> list[int]:
    """A prompt of ``length`` tokens, different for each ``n`` (no prefix sharing)."""
    return [(n * 31 + i * 7 + 1) % 256 for i in range(length)]


def first_token_step(engine: Engine, seqs: list[Sequence]) -> dict[tuple[str, int], int]:
    """Step until ``seqs`` finish: the step each got its first token (``"first", id``),
    and the step it finished (``"done", id``)."""
    steps: dict[tuple[str, int], int] = {}
    step = 0
    while not all(seq.is_finished for seq in seqs):
        result = engine.step()
        assert result is not None
        step += 1
        for seq in result.seqs:
            steps.setdefault(("first", seq.id), step)
        for seq in result.finished:
            steps["done", seq.id] = step
    return steps


@pytest.mark.parametrize("host_kv_blocks", [0, 32])
def test_a_high_one_waiting_for_a_slot_starts_before_the_running_low_one_finishes(
    host_kv_blocks: int,
) -> None:
    engine = make_engine(max_num_seqs=1, host_kv_blocks=host_kv_blocks)
    low = engine.add(prompt(0), LONG, LOW)
    for _ in range(3):
        assert engine.step() is not None  # the low one prefills and decodes
    high = engine.add(prompt(1), SHORT, HIGH)
    steps = first_token_step(engine, [low, high])
    # Before the fix the high one waited for all 40 of the low one's tokens.
    assert steps["first", high.id] == 1
    assert steps["done", high.id] < steps["done", low.id]
    assert engine.scheduler.num_priority_preemptions == 1
    # The preempted one resumed once the high one left, with the same greedy output.
    assert low.output == engine.model.greedy_reference(prompt(0), LONG.max_tokens)
    assert high.output == engine.model.greedy_reference(prompt(1), SHORT.max_tokens)
    stats = engine.stats()
    assert stats["kv_blocks_used"] == stats["kv_host_blocks_used"] == 0
    if host_kv_blocks:  # paged out and back in, not recomputed
        assert stats["kv_swap_outs"] == stats["kv_swap_ins"] == 1
        assert low.num_preemptions == stats["preemptions"] == 0
        assert stats["prompt_tokens_computed"] == 2 * len(prompt(0))
    else:
        assert low.num_preemptions == stats["preemptions"] == 1
        assert stats["kv_swap_outs"] == 0
        assert stats["prompt_tokens_computed"] > 2 * len(prompt(0))


@pytest.mark.parametrize("host_kv_blocks", [0, 32])
def test_a_high_one_waiting_for_kv_blocks_preempts_the_fewest_lowest_ones(
    host_kv_blocks: int,
) -> None:
    # 14 blocks of 4 tokens; three running sequences of 3 blocks each (normal,
    # low, low), 5 blocks free. A high prompt of 36 tokens needs 9: two must go,
    # the newest low first, then the other low; the normal one keeps running.
    engine = make_engine(num_blocks=14, max_num_seqs=8, host_kv_blocks=host_kv_blocks)
    params = SamplingParams(max_tokens=6)
    running = [engine.add(prompt(i, 11), params, p) for i, p in enumerate([NORMAL, LOW, LOW])]
    assert engine.step() is not None
    assert engine.blocks.stats().num_used == 9
    high = engine.add(prompt(9, 36), SHORT, HIGH)
    result = engine.step()
    assert result is not None
    assert result.is_prefill
    assert result.seqs == [high]
    normal, low_old, low_new = running
    assert normal.status is SequenceStatus.RUNNING
    assert engine.scheduler.num_priority_preemptions == 2
    assert low_old.status is low_new.status
    assert low_new.status is (SequenceStatus.SWAPPED if host_kv_blocks else SequenceStatus.WAITING)
    engine.run_until_done([*running, high])
    for i, seq in enumerate(running):
        assert seq.output == engine.model.greedy_reference(prompt(i, 11), params.max_tokens)
    assert high.output == engine.model.greedy_reference(prompt(9, 36), SHORT.max_tokens)
    assert engine.blocks.stats().num_used == 0


def test_nothing_is_preempted_when_even_every_candidate_would_not_make_room() -> None:
    # The running ones are high: no candidate. And a normal waiting one never preempts.
    engine = make_engine(max_num_seqs=1)
    high = engine.add(prompt(0), LONG, HIGH)
    assert engine.step() is not None
    other = engine.add(prompt(1), SHORT, HIGH)
    assert engine.step() is not None
    assert high.num_preemptions == 0
    assert other.status is SequenceStatus.WAITING
    engine.run_until_done([high, other])
    engine = make_engine(max_num_seqs=1)
    low = engine.add(prompt(0), LONG, LOW)
    assert engine.step() is not None
    normal = engine.add(prompt(1), SHORT, NORMAL)
    engine.run_until_done([low, normal])
    assert low.num_preemptions == 0
    assert engine.scheduler.num_priority_preemptions == 0


def test_off_the_high_one_waits_as_before() -> None:
    engine = make_engine(max_num_seqs=1, preempt_for_high=False)
    low = engine.add(prompt(0), LONG, LOW)
    assert engine.step() is not None
    high = engine.add(prompt(1), SHORT, HIGH)
    steps = first_token_step(engine, [low, high])
    assert steps["first", high.id] > steps["done", low.id] - 1
    assert low.num_preemptions == 0


@pytest.mark.parametrize("host_kv_blocks", [0, 32])
def test_a_stream_of_high_ones_never_starves_a_low_one(host_kv_blocks: int) -> None:
    # A new high request every other step, for ever: the low one is preempted,
    # ages past the bound, and from then on is served as high and never preempted again.
    bound = 30
    engine = make_engine(max_num_seqs=1, priority_age_bound=bound, host_kv_blocks=host_kv_blocks)
    low = engine.add(prompt(0), LONG, LOW)
    assert engine.step() is not None  # it runs before the first high one comes
    highs: list[Sequence] = []
    steps = 0
    while not low.is_finished:
        if steps % 2 == 0:
            highs.append(engine.add(prompt(len(highs) + 1), SamplingParams(max_tokens=2), HIGH))
        assert engine.step() is not None
        steps += 1
        assert steps < 2000, "the low one never finished"
    sched = engine.scheduler
    pushed_back = low.num_preemptions + (
        sched.num_swap_outs if isinstance(sched, TieredScheduler) else 0
    )
    assert pushed_back >= 1
    # Preemptions stop once it is past the bound: at most one per step before it.
    assert pushed_back <= bound
    assert low.output == engine.model.greedy_reference(prompt(0), LONG.max_tokens)
    for seq in highs:
        if not seq.is_finished:
            engine.abort(seq)
    stats = engine.stats()
    assert stats["kv_blocks_used"] == stats["kv_host_blocks_used"] == 0


def test_a_swapped_low_one_waits_while_a_high_one_does_and_comes_back_after() -> None:
    engine = make_engine(max_num_seqs=1, host_kv_blocks=32)
    sched = engine.scheduler
    assert isinstance(sched, TieredScheduler)
    low = engine.add(prompt(0), LONG, LOW)
    assert engine.step() is not None
    highs = [engine.add(prompt(i), SHORT, HIGH) for i in (1, 2)]
    assert engine.step() is not None
    assert low.status is SequenceStatus.SWAPPED
    # Not paged back in while the second high one waits: it would be preempted again.
    while not all(seq.is_finished for seq in highs):
        assert engine.step() is not None
        assert low.status is SequenceStatus.SWAPPED
        assert sched.num_swap_outs == 1
    engine.run_until_done([low])
    assert sched.num_swap_ins == 1
    assert low.output == engine.model.greedy_reference(prompt(0), LONG.max_tokens)


# -- max_num_seqs holds at every step --------------------------------------------


def holding(engine: Engine) -> int:
    """Sequences in the decode batch or bound for it: running, ready, paging in or back."""
    sched = engine.scheduler
    pager = engine.prefix_pager
    swapping_in = len(sched.incoming) if isinstance(sched, TieredScheduler) else 0
    paging_back = len(pager.incoming) if pager is not None else 0
    return len(sched.running) + len(sched.ready) + swapping_in + paging_back


def test_sequences_paged_back_for_a_prefix_hold_their_place_in_max_num_seqs() -> None:
    # Both tiers. Two prompts whose first block is in the prefix tier page it back
    # together; their tails (11 tokens each) do not fit one step's budget of 16,
    # so the second waits in ``ready``. Before the fix a short prompt was admitted
    # beside the first (the one in ``ready`` held no slot), and four ran at once
    # with ``max_num_seqs`` 3.
    engine = make_engine(
        num_blocks=14,
        max_num_seqs=3,
        max_num_batched_tokens=16,
        host_kv_blocks=32,
        host_prefix_blocks=32,
    )
    firsts = [prompt(100), prompt(101)]
    for first in firsts:
        engine.generate([first], SamplingParams(max_tokens=2))
    for i in range(8):  # other traffic evicts their blocks to the prefix tier
        engine.generate([prompt(200 + i, 15)], SamplingParams(max_tokens=2))
    tails = [prompt(300 + i, 11) for i in range(2)]
    hits = [first[:4] + tail for first, tail in zip(firsts, tails, strict=True)]
    assert all(engine.blocks.cached_prefix(hit) == 0 for hit in hits)
    pager = engine.prefix_pager
    assert pager is not None
    limit = engine.config.scheduler.max_num_seqs
    running = engine.add(prompt(0), LONG)
    assert engine.step() is not None
    late = [engine.add(hit, SHORT) for hit in hits]
    assert engine.step() is not None
    assert len(pager.incoming) == 2  # both paging back
    for record in pager.incoming:
        pager.tier.wait(record.handle)  # a condition, not a sleep: the copies are done
    shorts = [engine.add(prompt(400 + i, 2), SHORT) for i in range(2)]
    seqs = [running, *late, *shorts]
    while not all(seq.is_finished for seq in seqs):
        assert engine.step() is not None
        assert len(engine.scheduler.running) <= limit
        assert holding(engine) <= limit
    for seq in seqs:
        expected = engine.model.greedy_reference(
            seq.tokens[: seq.num_prompt], seq.params.max_tokens
        )
        assert seq.output == expected
    assert engine.stats()["kv_prefix_page_backs"] == 2


@pytest.mark.parametrize("seed", range(6))
def test_with_both_tiers_and_priorities_the_batch_never_runs_over_max_num_seqs(seed: int) -> None:
    rng = random.Random(seed)
    limit = 3
    engine = make_engine(
        num_blocks=12,
        max_num_seqs=limit,
        max_num_batched_tokens=24,
        host_kv_blocks=64,
        host_prefix_blocks=64,
        priority_age_bound=40,
    )
    prefixes = [[rng.randrange(256) for _ in range(8)] for _ in range(3)]
    seqs: list[Sequence] = []
    for _ in range(250):
        for _ in range(rng.choice([0, 0, 1, 2])):
            tokens = rng.choice(prefixes) + [rng.randrange(256) for _ in range(rng.randrange(1, 9))]
            params = SamplingParams(max_tokens=rng.randrange(1, 14))
            seqs.append(engine.add(tokens, params, rng.choice([HIGH, NORMAL, LOW, LOW])))
        engine.step()
        assert len(engine.scheduler.running) <= limit
        assert holding(engine) <= limit
    while engine.has_work:
        engine.step()
        assert holding(engine) <= limit
    assert all(seq.is_finished for seq in seqs)
    for seq in seqs[:20]:
        assert seq.output == engine.model.greedy_reference(
            seq.tokens[: seq.num_prompt], seq.params.max_tokens
        )
    stats = engine.stats()
    assert stats["kv_blocks_used"] == stats["kv_host_blocks_used"] == 0
    assert stats["kv_prefix_pinned"] == 0

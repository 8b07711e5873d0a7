"""Priority inside the engine: the ``ready`` queue (KV already in its blocks) by priority too."""

from __future__ import annotations

from typing import Any

import pytest

from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.scheduler import Batch, Scheduler, SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence, SequenceStatus
from yieldgate.protocol import Priority

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
ONE = SamplingParams(max_tokens=1)


def make_scheduler(*, budget: int, **config: Any) -> Scheduler:
    blocks = BlockManager(num_blocks=32, block_size=4)
    cfg = SchedulerConfig(watermark=0.0, max_num_batched_tokens=budget, **config)
    return Scheduler(cfg, blocks)


def prompt(n: int, length: int = 4) -> list[int]:
    """``length`` tokens, different for each ``n`` (no prefix sharing)."""
    return [(n * 31 + i * 7 + 1) % 256 for i in range(length)]


def arrive(sched: Scheduler, seq_id: int, priority: Priority, *, failed: bool = False) -> Sequence:
    """``seq_id`` reserved for a prefill worker and back: its last prompt token left to prefill.

    ``failed``: the worker gave up on it, so its whole prompt is left.
    """
    seq = Sequence(seq_id, prompt(seq_id, 8 if failed else 4), ONE, priority)
    assert sched.reserve_remote(seq)
    if failed:
        sched.remote_failed(seq)
    else:
        sched.kv_arrived(seq, len(seq.tokens) - 1)
    assert seq.status is SequenceStatus.READY
    return seq


def step(sched: Scheduler) -> list[int]:
    """One prefill step: the ids it took; they finish (one token each) and free their blocks."""
    batch = sched.schedule()
    assert batch is not None
    assert batch.is_prefill
    sched.finish_step(batch, [0] * len(batch.seqs))
    return [seq.id for seq in batch.seqs]


def serve_all(sched: Scheduler) -> list[list[int]]:
    batches: list[list[int]] = []
    while sched.has_work:
        batches.append(step(sched))
    return batches


def test_ready_sequences_are_prefilled_high_then_normal_then_low_in_arrival_order() -> None:
    # A budget of two tokens: two of the one-token ready sequences a step.
    sched = make_scheduler(budget=2)
    for seq_id, priority in enumerate([LOW, NORMAL, HIGH, LOW, HIGH, NORMAL]):
        arrive(sched, seq_id, priority)
    assert [seq.id for seq in sched.ready_order()] == [2, 4, 1, 5, 0, 3]
    assert serve_all(sched) == [[2, 4], [1, 5], [0, 3]]
    assert sched.blocks.stats().num_used == 0


def test_with_priority_off_ready_sequences_are_prefilled_in_arrival_order() -> None:
    sched = make_scheduler(budget=2, priority=False)
    for seq_id, priority in enumerate([LOW, NORMAL, HIGH, LOW]):
        arrive(sched, seq_id, priority)
    assert [seq.id for seq in sched.ready_order()] == [0, 1, 2, 3]
    assert serve_all(sched) == [[0, 1], [2, 3]]
    assert sched.blocks.stats().num_used == 0


@pytest.mark.parametrize("priority", [True, False])
def test_the_ready_front_that_does_not_fit_blocks_the_smaller_ones_behind_it(
    priority: bool,
) -> None:
    # Budget 8: the high one whose worker failed needs all 8 tokens, so it waits for
    # the next step, and the one-token low one behind it does not slip past it.
    sched = make_scheduler(budget=8, priority=priority)
    arrive(sched, 0, LOW)
    arrive(sched, 1, HIGH)
    arrive(sched, 2, HIGH, failed=True)
    if priority:
        assert serve_all(sched) == [[1], [2], [0]]
    else:  # arrival order; the failed one still goes alone, first in its step
        assert serve_all(sched) == [[0, 1], [2]]
    assert sched.blocks.stats().num_used == 0


@pytest.mark.parametrize("bound", [1, 3, 8])
def test_a_ready_low_sequence_is_prefilled_at_the_age_bound_despite_a_steady_high_stream(
    bound: int,
) -> None:
    sched = make_scheduler(budget=1, priority_age_bound=bound)
    low = arrive(sched, 0, LOW)
    served: list[int] = []
    for i in range(bound + 4):
        arrive(sched, i + 1, HIGH)  # one new high sequence back from its worker every step
        served += step(sched)
    # The highs that came before the bound first, then the low one, then the highs again.
    assert served.index(low.id) == bound
    assert served[:bound] == list(range(1, bound + 1))
    assert low.status is SequenceStatus.FINISHED


def test_ready_sequences_take_no_place_in_max_num_seqs_as_before() -> None:
    # They hold their blocks already: max_num_seqs limits only the waiting ones after them.
    sched = make_scheduler(budget=64, max_num_seqs=2)
    for seq_id, priority in enumerate([LOW, HIGH, NORMAL]):
        arrive(sched, seq_id, priority)
    waiting = Sequence(3, prompt(3), ONE, HIGH)
    sched.add(waiting)
    batch = sched.schedule()
    assert isinstance(batch, Batch)
    assert [seq.id for seq in batch.seqs] == [1, 2, 0]
    assert waiting.status is SequenceStatus.WAITING

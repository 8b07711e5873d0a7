"""Priority inside the engine: waiting queue, preemption, swapped returns, prefill queues."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from tests.conftest import run_cli
from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.block_manager import BlockManager
from yieldgate.harness.disagg import Disaggregation
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.kv_tiers import TieredScheduler
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.prefill_pool import PrefillPool, WorkerState
from yieldgate.harness.prefill_worker import WorkerSpec
from yieldgate.harness.router import Router, RouterConfig
from yieldgate.harness.scheduler import Scheduler, SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence, SequenceStatus
from yieldgate.harness.transfer import decode_message
from yieldgate.protocol import Priority
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)
ONE = SamplingParams(max_tokens=1)


def make_engine(**scheduler: Any) -> Engine:
    overrides = {
        key: scheduler.pop(key)
        for key in ("num_blocks", "block_size", "host_kv_blocks")
        if key in scheduler
    }
    config = SchedulerConfig(**{"watermark": 0.0, **scheduler})
    return Engine(
        EngineConfig(
            **{"model": SMALL, "device": "cpu", "num_blocks": 64, **overrides}, scheduler=config
        )
    )


def prompt(n: int) -> list[int]:
    """Four tokens (one block of four), different for each ``n`` (no prefix sharing)."""
    return [n % 256, (n * 7 + 1) % 256, (n * 13 + 2) % 256, (n * 29 + 3) % 256]


def first_token_order(engine: Engine, seqs: list[Sequence]) -> list[int]:
    """Step until ``seqs`` finish; the ids in the order they got their first token."""
    order: list[int] = []
    while not all(seq.is_finished for seq in seqs):
        result = engine.step()
        assert result is not None
        if result.is_prefill:
            order += [seq.id for seq in result.seqs]
    return order


# -- the waiting queue ---------------------------------------------------------


def test_the_waiting_queue_serves_high_then_normal_then_low_in_arrival_order() -> None:
    engine = make_engine(max_num_seqs=1, priority_age_bound=1000)
    arrivals = [LOW, NORMAL, HIGH, LOW, HIGH, NORMAL]
    seqs = [engine.add(prompt(i), ONE, p) for i, p in enumerate(arrivals)]
    assert [seq.priority for seq in seqs] == arrivals
    assert first_token_order(engine, seqs) == [2, 4, 1, 5, 0, 3]
    assert engine.blocks.stats().num_used == 0


def test_with_priority_off_the_waiting_queue_is_first_come_first_served() -> None:
    engine = make_engine(max_num_seqs=1, priority=False)
    seqs = [engine.add(prompt(i), ONE, p) for i, p in enumerate([LOW, NORMAL, HIGH, LOW])]
    assert first_token_order(engine, seqs) == [0, 1, 2, 3]


@pytest.mark.parametrize("bound", [1, 3, 8])
def test_a_low_request_is_served_after_the_age_bound_despite_a_steady_high_stream(
    bound: int,
) -> None:
    engine = make_engine(max_num_seqs=1, priority_age_bound=bound)
    low = engine.add(prompt(0), ONE, LOW)
    served: list[int] = []
    for step in range(bound + 4):
        engine.add(prompt(step + 1), ONE, HIGH)  # one new high request every step
        result = engine.step()
        assert result is not None
        assert result.is_prefill
        served += [seq.id for seq in result.seqs]
    # The highs that came before the bound first, then the low one, then the highs again.
    assert served.index(low.id) == bound
    assert served[:bound] == list(range(1, bound + 1))
    assert low.is_finished


def test_the_age_bound_is_validated() -> None:
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="priority_age_bound"):
            SchedulerConfig(priority_age_bound=bad)


def test_the_cli_names_the_flag_of_a_bad_age_bound() -> None:
    result = run_cli("serve", "--backend", "harness", "--priority-age-bound", "0")
    assert result.returncode == 2
    assert "--priority-age-bound must be an integer >= 1" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_front_request_that_does_not_fit_still_blocks_the_lower_ones_behind_it() -> None:
    # 4 blocks of 4: a high prompt needing 3 blocks waits for a running one to
    # finish (preemption for it off); the small low prompt behind it does not slip past it.
    blocks = BlockManager(4, 4)
    sched = Scheduler(SchedulerConfig(watermark=0.0, preempt_for_high=False), blocks)
    running = Sequence(0, prompt(0) * 2, SamplingParams(max_tokens=2), NORMAL)
    sched.add(running)
    assert sched.schedule() is not None
    big = Sequence(1, list(range(12)), ONE, HIGH)
    small = Sequence(2, prompt(2), ONE, LOW)
    sched.add(small)
    sched.add(big)
    batch = sched.schedule()
    assert batch is not None
    assert not batch.is_prefill  # a decode: neither was admitted
    assert sched.waiting_order() == [big, small]


# -- preemption ----------------------------------------------------------------


def record_victims(engine: Engine) -> list[int]:
    """The ids of the sequences ``engine``'s scheduler preempts, in order, as it preempts them."""
    victims: list[int] = []
    sched = engine.scheduler
    preempt = sched._preempt

    def record(seq: Sequence) -> None:
        victims.append(seq.id)
        preempt(seq)

    sched._preempt = record  # type: ignore[method-assign]
    return victims


def test_preemption_takes_low_then_normal_newest_first_and_never_high() -> None:
    # 4 blocks of 4 tokens, four one-block prompts: every decode step needs blocks.
    engine = make_engine(num_blocks=4, block_size=4, max_num_seqs=4)
    victims = record_victims(engine)
    params = SamplingParams(max_tokens=6)
    seqs = [engine.add(prompt(i), params, p) for i, p in enumerate([HIGH, LOW, NORMAL, LOW])]
    engine.run_until_done(seqs)
    assert victims[:3] == [3, 1, 2]  # newest low, older low, then normal
    assert 0 not in victims
    assert engine.blocks.stats().num_used == 0


def test_with_priority_off_preemption_takes_the_newest_whatever_its_priority() -> None:
    engine = make_engine(num_blocks=4, block_size=4, max_num_seqs=4, priority=False)
    victims = record_victims(engine)
    params = SamplingParams(max_tokens=6)
    seqs = [engine.add(prompt(i), params, p) for i, p in enumerate([LOW, LOW, NORMAL, HIGH])]
    engine.run_until_done(seqs)
    assert victims[0] == 3  # the high one, the newest


def test_swapped_sequences_come_back_by_priority_and_every_block_is_given_back() -> None:
    engine = make_engine(num_blocks=3, block_size=4, max_num_seqs=3, host_kv_blocks=8)
    sched = engine.scheduler
    assert isinstance(sched, TieredScheduler)
    params = SamplingParams(max_tokens=4)
    low, normal, high = (
        engine.add(prompt(i), params, p) for i, p in enumerate([LOW, NORMAL, HIGH])
    )
    assert engine.step() is not None  # one prefill step admits all three
    assert engine.step() is not None  # a decode step: two of them are paged out
    assert high.status is SequenceStatus.RUNNING
    assert [record.seq for record in sched.swapped] == [normal, low]
    engine.run_until_done([low, normal, high])
    assert engine.blocks.stats().num_used == 0
    assert engine.stats()["kv_host_blocks_used"] == 0


# -- the ledger ----------------------------------------------------------------


def test_aborting_waiting_and_preempted_low_sequences_frees_everything() -> None:
    engine = make_engine(num_blocks=4, block_size=4, max_num_seqs=4)
    params = SamplingParams(max_tokens=6)
    seqs = [engine.add(prompt(i), params, p) for i, p in enumerate([HIGH, NORMAL, LOW, LOW])]
    waiting = engine.add(prompt(9), params, LOW)
    while not any(seq.num_preemptions for seq in seqs):
        assert engine.step() is not None
    preempted = [seq for seq in seqs if seq.status is SequenceStatus.WAITING]
    assert preempted
    assert all(seq.priority is LOW for seq in preempted)
    for seq in [*preempted, waiting]:
        engine.abort(seq)
        assert seq.is_finished
    rest = [seq for seq in seqs if seq not in preempted]
    engine.run_until_done(rest)
    assert not engine.has_work
    assert engine.blocks.stats().num_used == 0
    assert engine.stats()["waiting"] == engine.stats()["running"] == 0


# -- through the backend -------------------------------------------------------


@pytest.fixture
async def backend() -> AsyncIterator[HarnessBackend]:
    harness = HarnessBackend(HarnessConfig(engine=EngineConfig(device="cpu", num_blocks=128)))
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(harness.start, Governor(GovernorConfig(max_inflight=4)))
        yield harness
    finally:
        await harness.aclose()


@pytest.mark.anyio
async def test_a_requests_priority_reaches_its_sequence(backend: HarnessBackend) -> None:
    engine = backend.engine
    assert engine is not None
    seen: list[Priority] = []
    create = engine.create

    def recording(*args: Any) -> Sequence:
        seq = create(*args)
        seen.append(seq.priority)
        return seq

    engine.create = recording  # type: ignore[method-assign]
    for priority in (LOW, HIGH, NORMAL):
        work = Work(id="r", body="Hi", params={"max_tokens": 2}, priority=priority)
        result = await backend.execute(work, None)
        assert result["completion_tokens"] == 2
    assert seen == [LOW, HIGH, NORMAL]


# -- the prefill workers' queues -------------------------------------------------


class FakeConn:
    """A worker's control connection that records the jobs sent."""

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send_bytes(self, raw: bytes) -> None:
        message = decode_message(raw)
        assert message["op"] == "prefill"
        self.sent.append(message["id"])


SPEC = WorkerSpec(
    model={},
    checkpoint=None,
    device="cpu",
    num_blocks=16,
    block_size=4,
    max_batch_tokens=8,  # a window of 16 tokens: one of the jobs below at a time
    torch_threads=1,
    timeout_s=5.0,
)


def fake_worker(pool: PrefillPool) -> tuple[WorkerState, FakeConn]:
    conn = FakeConn()
    worker = WorkerState(index=0, rank=1, process=None, conn=conn)  # type: ignore[arg-type]
    pool.workers.append(worker)  # no link thread: the test plays the worker's side
    return worker, conn


def make_pool(*, priority: bool, age_bound: int = 64) -> tuple[PrefillPool, WorkerState, FakeConn]:
    pool = PrefillPool(
        1,
        SPEC,
        on_kv=lambda *_: None,
        on_failed=lambda *_: None,
        on_dead=lambda _: None,
        priority=priority,
        age_bound=age_bound,
        window_tokens=10,
    )
    worker, conn = fake_worker(pool)
    return pool, worker, conn


def job(n: int) -> list[int]:
    return [n] * 10  # 9 tokens to prefill: one job fills the window of 10


@pytest.mark.parametrize("priority", [True, False])
def test_a_prefill_worker_gets_its_held_jobs_high_then_normal_then_low(priority: bool) -> None:
    pool, worker, conn = make_pool(priority=priority)
    ranks = {1: 2, 2: 2, 3: 1, 4: 0, 5: 1}  # request id -> rank (0 high, 2 low)
    for request_id, rank in ranks.items():
        assert pool.submit(0, request_id, job(request_id), 0, rank=rank)
    assert pool.high_jobs_queued() == 1
    if not priority:
        assert conn.sent == [1, 2, 3, 4, 5]  # first come, first served: all sent at once
        return
    assert conn.sent == [1]  # the rest wait here, not at the worker
    assert worker.jobs.queued_for(0) == (2, 18)  # a high job waits behind the sent one only
    assert worker.jobs.queued_for(2) == (5, 45)
    for done in (1, 4, 3, 5):
        assert pool._unassign(worker, done)  # the worker's KV arrived: the next one goes
    assert conn.sent == [1, 4, 3, 5, 2]
    assert pool._unassign(worker, 2)
    assert (worker.assigned, worker.jobs.sent, worker.jobs.held) == ({}, {}, [])


def test_a_held_low_job_goes_as_high_once_passed_over_by_the_age_bound() -> None:
    pool, worker, conn = make_pool(priority=True, age_bound=2)
    assert pool.submit(0, 1, job(1), 0, rank=0)
    assert pool.submit(0, 2, job(2), 0, rank=2)  # held at 1 send
    next_id = 3
    for _ in range(4):  # a steady high stream: one new high job as each finishes
        assert pool.submit(0, next_id, job(next_id), 0, rank=0)
        assert pool._unassign(worker, conn.sent[-1])
        next_id += 1
    assert conn.sent[:5] == [1, 3, 4, 2, 5]  # passed over twice (by 3 and 4), the low one goes


def test_cancelling_a_held_job_forgets_it_and_an_unsent_job_is_never_sent() -> None:
    pool, worker, conn = make_pool(priority=True)
    assert pool.submit(0, 1, job(1), 0, rank=1)
    assert pool.submit(0, 2, job(2), 0, rank=2)
    assert pool.cancel(2)
    assert not pool.cancel(1)  # sent already: its KV comes back and is ignored
    assert pool._unassign(worker, 1)
    assert conn.sent == [1]
    assert (worker.assigned, worker.jobs.sent, worker.jobs.held) == ({}, {}, [])


def test_an_aborted_request_whose_prefill_job_is_held_gives_everything_back() -> None:
    engine = make_engine(block_size=4)
    router = Router(
        RouterConfig(prefill_length_threshold=8, busy_length_threshold=8, max_prefill_queue=64)
    )
    disagg = Disaggregation(engine, router, 0, SPEC, lambda op, payload: None)
    worker, conn = fake_worker(disagg.pool)
    seqs = [engine.create(list(range(i, i + 12)), ONE, p) for i, p in enumerate([LOW, LOW, HIGH])]
    for seq in seqs:
        disagg.place(seq, seq.priority)
    assert all(seq.status is SequenceStatus.REMOTE for seq in seqs)
    assert conn.sent == [0]
    disagg.abort(seqs[1])  # a held low job: dropped here, never sent
    assert [job.request_id for job, _ in worker.jobs.held] == [2]
    assert disagg.pool._unassign(worker, 0)  # the first one's KV came: the high one goes next
    assert conn.sent == [0, 2]
    disagg.abort(seqs[0])
    disagg.abort(seqs[2])  # sent: its KV will come back and be ignored
    assert disagg.pool._unassign(worker, 2)
    assert all(seq.is_finished for seq in seqs)
    assert engine.blocks.stats().num_used == 0
    assert (worker.assigned, worker.jobs.sent, worker.jobs.held) == ({}, {}, [])

"""QoS early rejection with priority inside the engine: the queue ahead of a request is its
priority's, so a low-priority backlog does not count against a high request."""

from __future__ import annotations

from typing import Any

import pytest

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.degrade import DegradeConfig, Degrader
from yieldgate.harness.disagg import Disaggregation
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.prefill_pool import WorkerState
from yieldgate.harness.prefill_worker import WorkerSpec
from yieldgate.harness.qos import EngineLoad, QosPolicy, SloConfig, TtftEstimator
from yieldgate.harness.router import Router, RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams, Sequence
from yieldgate.protocol import Priority
from yieldgate.server.governor import AdmissionRequest, Rejection

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)


def engine_config(priority: bool, **scheduler: Any) -> EngineConfig:
    return EngineConfig(
        model=SMALL,
        device="cpu",
        num_blocks=256,
        scheduler=SchedulerConfig(priority=priority, **scheduler),
    )


def prompt(n: int, length: int = 16) -> list[int]:
    """``length`` tokens, different for each ``n`` (no prefix sharing between prompts)."""
    return [(n * 31 + i * 7 + 1) % 256 for i in range(length)]


# -- the admission check over a backlog ------------------------------------------


def harness_with_backlog(priority: bool, where: str) -> HarnessBackend:
    """An unstarted backend whose published load is 10 low prompts of 64 tokens, queued
    in the engine or handed over in the inbox; 1 ms a prompt token, and a high objective."""
    config = HarnessConfig(
        engine=engine_config(priority),
        qos=True,
        slo=SloConfig(ttft_ms_high=100.0, ttft_ms_normal=200.0, ttft_ms_low=500.0),
    )
    harness = HarnessBackend(config)
    assert harness.qos is not None
    harness.qos.estimator.prefill_ms_per_token = 1.0
    harness.qos.estimator.decode_step_ms = 1.0
    if where == "engine":
        engine = Engine(config.engine)
        for n in range(10):
            engine.add(prompt(n, 64), SamplingParams(max_tokens=4), LOW)
        harness._publish_load(engine)  # what the engine thread does after every step
    else:
        harness._tokens_sent[2] = 640  # handed to the engine thread, not taken in yet
    return harness


def check(harness: HarnessBackend, priority: Priority) -> Rejection | None:
    return harness._check_slo(
        AdmissionRequest(priority=priority, body="x", params={}, inflight=0, capacity=4)
    )


def hint(rejection: Rejection | None) -> int | None:
    return None if rejection is None else rejection.retry_hint_ms


@pytest.mark.parametrize("where", ["engine", "inbox"])
def test_a_high_request_is_admitted_past_a_low_backlog_only_with_engine_priority(
    where: str,
) -> None:
    on = harness_with_backlog(True, where)
    off = harness_with_backlog(False, where)
    if where == "engine":
        assert on._load_now == EngineLoad((0, 0, 640), 0, 0)
        assert off._load_now == EngineLoad((640, 640, 640), 0, 0)
    # With priority the engine serves high and normal before the 640 low tokens:
    # each waits for its own 1-token prompt only.
    assert check(on, HIGH) is None
    assert check(on, NORMAL) is None
    # First come, first served: the same load is 641 ms ahead of either objective.
    assert hint(check(off, HIGH)) == 641 - 100
    assert hint(check(off, NORMAL)) == 641 - 200
    # A low request waits behind everything either way.
    assert hint(check(on, LOW)) == hint(check(off, LOW)) == 641 - 500
    assert on.qos is not None
    assert on.qos.stats()["rejected"] == {"high": 0, "normal": 0, "low": 1}


@pytest.mark.parametrize(
    ("degraded", "pressure"),
    [(frozenset({LOW}), 641 / 500), (frozenset({NORMAL}), 1 / 200)],
    ids=["low", "normal"],
)
def test_degradation_pressure_is_the_degraded_priorities_queue_whoever_asks(
    degraded: frozenset[Priority], pressure: float
) -> None:
    harness = harness_with_backlog(True, "engine")
    harness.degrader = Degrader(DegradeConfig(priorities=degraded))
    harness._degrade_objective = 500.0 if LOW in degraded else 200.0
    for priority in (HIGH, NORMAL, LOW):
        check(harness, priority)
        # Degrading normal is not called for by a low backlog the engine serves
        # after it; degrading low is, even when the reading comes with a high request.
        assert harness.degrader.stats(0.0)["pressure"] == pytest.approx(pressure)


def test_a_low_request_counts_every_priority_ahead_of_it() -> None:
    engine = Engine(engine_config(True))
    for n, priority in enumerate([LOW, HIGH, NORMAL, LOW, HIGH]):
        engine.add(prompt(n, 10 * (n + 1)), SamplingParams(max_tokens=2), priority)
    # 10 + 40 + 50 low, 20 + 50 high, 30 normal: a request sees its rank and those above.
    assert engine.scheduler.queued_tokens_ahead() == (70, 100, 150)


def test_an_aged_low_sequence_counts_as_high_once_past_the_age_bound() -> None:
    # One slot, held by a long high request: the low ones wait while the clock runs.
    engine = Engine(engine_config(True, max_num_seqs=1, priority_age_bound=3))
    engine.add(prompt(0), SamplingParams(max_tokens=20), HIGH)
    assert engine.step() is not None  # its prefill; it decodes from now on
    old = engine.add(prompt(1, 8), SamplingParams(max_tokens=2), LOW)
    assert engine.scheduler.queued_tokens_ahead() == (0, 0, 8)
    for _ in range(3):
        assert engine.step() is not None
    new = engine.add(prompt(2, 12), SamplingParams(max_tokens=2), LOW)
    # ``old`` waited 3 steps: it is served as high (ahead of a new high request too).
    assert engine.scheduler.queued_tokens_ahead() == (8, 8, 20)
    assert engine.scheduler.waiting_order() == [old, new]


# -- the prefill workers' queues ----------------------------------------------------

SPEC = WorkerSpec(
    model={},
    checkpoint=None,
    device="cpu",
    num_blocks=16,
    block_size=4,
    max_batch_tokens=6,  # a window of 12 tokens: one of the jobs below at a time
    torch_threads=1,
    timeout_s=5.0,
)


class FakeConn:
    def send_bytes(self, raw: bytes) -> None:
        pass


def disagg_with_a_worker(priority: bool, age_bound: int) -> tuple[Disaggregation, WorkerState]:
    engine = Engine(engine_config(priority, priority_age_bound=age_bound))
    router = Router(RouterConfig())
    disagg = Disaggregation(engine, router, 0, SPEC, lambda op, payload: None)
    worker = WorkerState(index=0, rank=1, process=None, conn=FakeConn())  # type: ignore[arg-type]
    disagg.pool.workers.append(worker)  # no link thread: the test plays the worker's side
    return disagg, worker


def remote_views(disagg: Disaggregation) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The QoS estimate's remote queue and the router's view of the one worker, by rank."""
    tokens = prompt(99, 12)
    router = tuple(disagg.worker_loads(tokens, rank)[0].queued_tokens for rank in range(3))
    return disagg.remote_tokens_ahead(), router


@pytest.mark.parametrize("priority", [True, False])
def test_the_remote_queue_qos_reads_is_the_one_the_router_sees(priority: bool) -> None:
    disagg, worker = disagg_with_a_worker(priority, age_bound=2)
    pool = disagg.pool
    # 11 tokens to prefill each: high 1 is sent, low 2 is held (with priority on).
    assert pool.submit(0, 1, prompt(1, 12), 0, rank=0)
    assert pool.submit(0, 2, prompt(2, 12), 0, rank=2)
    if not priority:
        assert remote_views(disagg) == ((22, 22, 22), (22, 22, 22))
        return
    assert remote_views(disagg) == ((11, 11, 22), (11, 11, 22))
    # A steady high stream passes the low job over twice (the age bound): then it is
    # served as high, and both views count it ahead of a new high job.
    assert pool.submit(0, 3, prompt(3, 12), 0, rank=0)
    assert pool._unassign(worker, 1)  # 3 goes
    assert pool.submit(0, 4, prompt(4, 12), 0, rank=0)
    assert remote_views(disagg) == ((22, 22, 33), (22, 22, 33))
    assert pool._unassign(worker, 3)  # 4 goes; the low one has waited two sends
    assert remote_views(disagg) == ((22, 22, 22), (22, 22, 22))


# -- the estimate against the engine's own steps -----------------------------------


def measured_and_estimated(priority: bool) -> tuple[float, float]:
    """A high request's TTFT under a low flood, in the estimator's own units.

    40 low prompts of 16 tokens flood an engine that prefills 64 tokens a step;
    after two steps a high one of 16 arrives. The estimate is taken from the
    published load just before; the TTFT is the steps that ran until its first
    token, each costed as the estimator costs it (1 ms a prompt token, 8 ms a
    decode step), so the comparison is deterministic.
    """
    per_token, step_ms = 1.0, 8.0
    engine = Engine(engine_config(priority, max_num_batched_tokens=64, max_num_seqs=64))
    flood = [engine.add(prompt(n), SamplingParams(max_tokens=4), LOW) for n in range(40)]
    for _ in range(2):
        assert engine.step() is not None
    harness = HarnessBackend(HarnessConfig(engine=engine.config, qos=True))
    harness._publish_load(engine)
    load = harness._load_now
    queued, running, steps_ahead = load.queued_ahead, load.running, load.steps_ahead
    qos = QosPolicy(
        SloConfig(), TtftEstimator(prefill_ms_per_token=per_token, decode_step_ms=step_ms)
    )
    estimate = qos.estimator.estimate_ms(
        prompt_tokens=16,
        queued_prefill_tokens=queued[0],
        decode_running=running,
        decode_steps_ahead=steps_ahead,
    )
    assert estimate is not None
    high: Sequence = engine.add(prompt(100), SamplingParams(max_tokens=2), HIGH)
    measured = 0.0
    while high.num_output == 0:
        result = engine.step()
        assert result is not None
        measured += result.num_new_tokens * per_token if result.is_prefill else step_ms
    engine.run_until_done([*flood, high])
    return measured, estimate


@pytest.mark.parametrize("priority", [True, False])
def test_the_high_estimate_under_a_low_flood_is_within_a_factor_of_its_ttft(
    priority: bool,
) -> None:
    measured, estimate = measured_and_estimated(priority)
    if priority:
        # Its own prompt and a step boundary (24) against the prefill batch it
        # joins, which low prompts fill up to 64 tokens: never the 512 tokens of
        # flood still waiting, which the first-come estimate counted (536).
        assert (measured, estimate) == (64.0, 24.0)
    else:
        # Behind the whole flood: 512 tokens, then its own 16 in a step alone.
        assert (measured, estimate) == (528.0, 536.0)
    # The bound: off by at most one prefill batch over its own prompt (64 / 16).
    assert estimate / 4 <= measured <= estimate * 4

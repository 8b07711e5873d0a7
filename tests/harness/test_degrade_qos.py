"""Degradation and early rejection together (``qos`` and ``degrade`` both set): degrade what
can be degraded, reject early what cannot meet its objective. Deterministic: seeded
measurements and the load the engine thread publishes, no timing."""

from __future__ import annotations

import time

import pytest

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.degrade import DegradeConfig, DegradeLevel
from yieldgate.harness.disagg import Disaggregation
from yieldgate.harness.engine import Engine, EngineConfig
from yieldgate.harness.model import ModelConfig
from yieldgate.harness.prefill_pool import WorkerState
from yieldgate.harness.prefill_worker import WorkerSpec
from yieldgate.harness.qos import EngineLoad, SloConfig
from yieldgate.harness.router import Router, RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.harness.sequence import SamplingParams
from yieldgate.protocol import Priority
from yieldgate.server.governor import AdmissionRequest, Rejection

HIGH, NORMAL, LOW = Priority.HIGH, Priority.NORMAL, Priority.LOW
SMALL = ModelConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64)
ENGINE = EngineConfig(model=SMALL, device="cpu", num_blocks=256, scheduler=SchedulerConfig())
SLO = SloConfig(ttft_ms_high=None, ttft_ms_normal=200.0, ttft_ms_low=500.0)
LEVELS = (DegradeLevel(pressure=1.0, max_tokens=8), DegradeLevel(pressure=3.0, reject=True))


def harness(
    *, qos: bool, load: EngineLoad, engine: EngineConfig = ENGINE, step_ms: float = 1.0
) -> HarnessBackend:
    """An unstarted backend with 1 ms a prompt token and ``step_ms`` a decode step, and
    ``load`` published as the engine thread would publish it."""
    backend = HarnessBackend(
        HarnessConfig(
            engine=engine,
            slo=SLO,
            qos=qos,
            degrade=DegradeConfig(sustain_s=0.5, levels=LEVELS),
        )
    )
    assert backend.qos is not None
    backend.qos.estimator.prefill_ms_per_token = 1.0
    backend.qos.estimator.decode_step_ms = step_ms
    backend._load_now = load
    return backend


def check(backend: HarnessBackend, priority: Priority) -> Rejection | None:
    return backend._check_slo(
        AdmissionRequest(priority=priority, body="x", params={}, inflight=0, capacity=4)
    )


# 900 low prompt tokens queued: 300 in the engine, 600 at the prefill worker.
QUEUED = (0, 0, 900)
LOCAL = (0, 0, 300)


def test_a_low_request_that_would_miss_its_objective_is_rejected_early_with_the_hint() -> None:
    # No high prefill at the worker: it would be sent there, behind all 900 tokens.
    both = harness(qos=True, load=EngineLoad(QUEUED, 0, 0, LOCAL, 0))
    rejection = check(both, LOW)
    assert rejection is not None
    assert rejection.retry_hint_ms == 901 - 500  # as plain QoS: the queue's excess
    assert check(both, HIGH) is None  # high priority has no objective: never rejected
    assert both.qos is not None
    assert both.qos.stats()["rejected"] == {"high": 0, "normal": 0, "low": 1}
    # Degradation alone admits it (its output may be cut instead): the old behaviour.
    alone = harness(qos=False, load=EngineLoad(QUEUED, 0, 0, LOCAL, 0))
    assert check(alone, LOW) is None


def test_a_low_request_kept_local_is_judged_on_the_decode_workers_queue() -> None:
    # A high prefill at the worker keeps a low prompt local (high_busy_jobs is 1):
    # it waits behind the engine's 300 tokens only, and 301 ms meets 500.
    both = harness(qos=True, load=EngineLoad(QUEUED, 0, 0, LOCAL, 1))
    assert check(both, LOW) is None
    # The engine's own queue long too: rejected, the hint that queue's excess.
    busy = harness(qos=True, load=EngineLoad((0, 0, 1200), 0, 0, (0, 0, 800), 1))
    rejection = check(busy, LOW)
    assert rejection is not None
    assert rejection.retry_hint_ms == 801 - 500
    # Without local prefill there is no cheaper route: the whole queue is ahead.
    no_local = HarnessBackend(
        HarnessConfig(
            engine=ENGINE,
            slo=SLO,
            qos=True,
            degrade=DegradeConfig(sustain_s=0.5, levels=LEVELS, local_prefill=False),
        )
    )
    assert no_local.qos is not None
    no_local.qos.estimator.prefill_ms_per_token = 1.0
    no_local._load_now = EngineLoad(QUEUED, 0, 0, LOCAL, 1)
    assert getattr(check(no_local, LOW), "retry_hint_ms", None) == 901 - 500


def chunked(load: EngineLoad) -> HarnessBackend:
    """As ``harness(qos=True)``, on an engine that prefills 64 tokens a step, 20 ms a
    decode step."""
    engine = EngineConfig(model=SMALL, device="cpu", scheduler=SchedulerConfig(prefill_chunk=64))
    return harness(qos=True, load=load, engine=engine, step_ms=20.0)


def low(backend: HarnessBackend, prompt_tokens: int) -> Rejection | None:
    return backend._check_slo(
        AdmissionRequest(priority=LOW, body="x" * prompt_tokens, params={}, inflight=0, capacity=4)
    )


def test_a_low_prompt_kept_local_must_fit_its_objective_in_pieces() -> None:
    """Kept local, a prompt of 400 tokens is computed in 7 pieces of 64, a decode step
    between two (3 sequences decoding): 400 + 7 x 20 = 540 ms against 500. Held to its
    own TTFT there (540) it would pass; it is held to its objective, or to what its
    prefill takes alone (400 ms) where that is longer, and rejected."""
    kept = chunked(EngineLoad(QUEUED, 3, 0, (0, 0, 0), 1))
    rejection = low(kept, 400)
    assert rejection is not None
    assert rejection.retry_hint_ms == 540 - 500
    # Sent to the prefill worker instead (no high one there), the queue empty: one
    # prefill step, no pieces, 400 + 20 ms. Admitted.
    assert low(chunked(EngineLoad((0, 0, 0), 3, 0, (0, 0, 0), 0)), 400) is None
    # Nothing decoding: no decode step between the pieces, 400 ms. Admitted.
    assert low(chunked(EngineLoad(QUEUED, 0, 0, (0, 0, 0), 1)), 400) is None
    # A prompt longer than the objective alone is held to its own prefill time: 700 ms.
    assert low(chunked(EngineLoad(QUEUED, 0, 0, (0, 0, 0), 1)), 700) is None
    assert low(chunked(EngineLoad(QUEUED, 0, 0, (0, 0, 1), 1)), 700) is not None


def test_a_rejecting_level_in_force_rejects_even_what_would_meet_its_objective() -> None:
    # 2,000 tokens queued (a reading of 2001 / 500, past the rejecting level's 3.0),
    # 300 of them in the engine: kept local, this request alone would meet 500 ms.
    both = harness(qos=True, load=EngineLoad((0, 0, 2000), 0, 0, LOCAL, 1))
    assert both.degrader is not None
    both.degrader.observe(time.monotonic() - 0.6, 10.0)  # above it for the last 0.6 s
    rejection = check(both, LOW)
    assert rejection is not None
    assert rejection.retry_hint_ms == 2001 - 500  # the reading's excess
    assert both.degrader.stats(time.monotonic())["rejected"] == 1
    assert check(both, HIGH) is None


def test_normal_priority_keeps_plain_early_rejection() -> None:
    both = harness(qos=True, load=EngineLoad((0, 250, 900), 0, 0, (0, 0, 300), 1))
    # Not degraded: never kept local, judged on its whole queue (251 ms against 200).
    assert getattr(check(both, NORMAL), "retry_hint_ms", None) == 251 - 200


def test_an_admitted_low_request_is_still_cut_under_sustained_overload() -> None:
    both = harness(qos=True, load=EngineLoad(QUEUED, 0, 0, LOCAL, 1))
    assert both.degrader is not None
    both.degrader.observe(time.monotonic() - 0.6, 1.5)  # level 0 in force: 8 tokens
    assert check(both, LOW) is None
    cut = both._degrade(LOW, SamplingParams(max_tokens=48))
    assert cut is not None
    assert cut["max_tokens"] == 8
    assert both._degrade(HIGH, SamplingParams(max_tokens=48)) is None


# -- what the engine thread publishes -----------------------------------------------

SPEC = WorkerSpec(
    model={},
    checkpoint=None,
    device="cpu",
    num_blocks=64,
    block_size=4,
    max_batch_tokens=64,
    torch_threads=1,
    timeout_s=5.0,
)


class FakeConn:
    def send_bytes(self, raw: bytes) -> None:
        pass


def test_the_published_load_splits_the_engines_queue_and_counts_high_at_the_workers() -> None:
    engine = Engine(ENGINE)
    disagg = Disaggregation(engine, Router(RouterConfig()), 0, SPEC, lambda op, payload: None)
    worker = WorkerState(index=0, rank=1, process=None, conn=FakeConn())  # type: ignore[arg-type]
    disagg.pool.workers.append(worker)  # no link thread: nothing is computed
    backend = HarnessBackend(HarnessConfig(engine=ENGINE, slo=SLO, qos=True))
    backend.disagg = disagg
    engine.add([7] * 20, SamplingParams(max_tokens=2), LOW)  # 20 low tokens here
    assert disagg.pool.submit(0, 1, [5] * 13, 0, rank=0)  # 12 high tokens at the worker
    backend._publish_load(engine)
    load = backend._load_now
    assert load.queued_ahead == (12, 12, 32)
    assert load.local_ahead == (0, 0, 20)
    assert load.high_remote == 1
    # Without workers there is no split: everything is local.
    alone = HarnessBackend(HarnessConfig(engine=ENGINE, slo=SLO, qos=True))
    alone._publish_load(engine)
    assert alone._load_now.local_ahead is None
    assert alone._load_now.high_remote == 0


def test_the_combination_needs_an_objective_for_the_degraded_priority() -> None:
    with pytest.raises(ValueError, match="objective"):
        HarnessConfig(
            engine=ENGINE,
            slo=SloConfig(ttft_ms_low=None),
            qos=True,
            degrade=DegradeConfig(),
        )

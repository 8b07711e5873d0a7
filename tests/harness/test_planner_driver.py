"""The planner's driver: first alone (fake harness, fake clock), then on a running harness.

For the running harness, one backend serves the module (its prefill workers
are processes). The planner's thread runs for real; the traffic it judges is
scripted through its ``record`` (real requests are recorded too, but with
objectives of 10 s they never move it), so the tests wait on conditions,
never on time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
import pytest

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.degrade import DegradeConfig
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.planner import Capacity, Planner, PlannerConfig
from yieldgate.harness.planner_driver import PlannerDriver
from yieldgate.harness.router import RouterConfig
from yieldgate.harness.scheduler import SchedulerConfig
from yieldgate.protocol import Priority
from yieldgate.server.backends import Work
from yieldgate.server.governor import Governor, GovernorConfig

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

PLANNER = PlannerConfig(
    ttft_ms=10_000.0,
    tpot_ms=10_000.0,
    min_samples=3,
    interval_s=0.05,
    cooldown_s=0.0,
    window_s=600.0,
    min_prefill_workers=0,
    max_prefill_workers=2,
    min_decode_seqs=2,
    max_decode_seqs=8,
    decode_step=2,
    long_prompt_tokens=100,
    min_long_share=0.0,
    # Off by default (an idle worker costs no CPU here); on, to test that stopping works.
    stop_idle_workers=True,
)
LONG = "a long prompt for the prefill workers, with many tokens in it. " * 4


class FakeHarness:
    """What the driver drives, as counters; ``fail`` makes starting a worker raise."""

    def __init__(self) -> None:
        self.workers = 1
        self.decode_seqs = 8
        self.fail = False

    def capacity(self) -> Capacity:
        return Capacity(
            prefill_workers=self.workers,
            prefill_queue=0,
            decode_seqs=self.decode_seqs,
            decode_running=0,
        )

    def start_worker(self) -> None:
        if self.fail:
            raise RuntimeError("no process today")
        self.workers += 1

    def stop_worker(self) -> None:
        self.workers -= 1

    def set_decode_seqs(self, count: int) -> None:
        self.decode_seqs = count


def test_the_driver_applies_and_logs_each_decision(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    planner = Planner(PLANNER)
    fake = FakeHarness()
    driver = PlannerDriver(
        planner,
        threading.Lock(),
        capacity=fake.capacity,
        start_worker=fake.start_worker,
        stop_worker=fake.stop_worker,
        set_decode_seqs=fake.set_decode_seqs,
        clock=lambda: now[0],
    )
    for _ in range(3):
        planner.record(0.0, ttft_ms=20_000.0, tpot_ms=1.0, prompt_tokens=500)
    with caplog.at_level(logging.INFO, logger="yieldgate.harness.planner"):
        [decision] = driver.tick()
    assert fake.workers == 2
    [record] = [r for r in caplog.records if r.name == "yieldgate.harness.planner"]
    assert record.planner == decision.to_dict()  # type: ignore[attr-defined]
    assert record.planner["reason"] == "ttft_over_objective"  # type: ignore[attr-defined]
    assert "start_prefill_worker -> 2" in record.getMessage()
    # A change that fails is logged and counted; the driver goes on.
    fake.fail = True
    fake.workers = 0
    now[0] = 1.0
    for _ in range(3):
        planner.record(1.0, ttft_ms=20_000.0, tpot_ms=1.0, prompt_tokens=500)
    assert driver.tick()[0].reason == "disaggregate"
    stats = driver.stats()
    assert (stats["applied"], stats["failures"], stats["decisions_total"]) == (1, 1, 2)
    now[0] = 2.0
    for _ in range(3):
        planner.record(2.0, ttft_ms=1.0, tpot_ms=20_000.0, prompt_tokens=10)
    assert driver.tick()[0].action == "set_decode_seqs"
    assert fake.decode_seqs == 6


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def harness() -> AsyncIterator[tuple[HarnessBackend, Governor]]:
    config = HarnessConfig(
        engine=EngineConfig(
            device="cpu", num_blocks=512, scheduler=SchedulerConfig(max_num_seqs=8)
        ),
        prefill_workers=1,
        router=RouterConfig(prefill_length_threshold=64, busy_length_threshold=64),
        planner=PLANNER,
        degrade=DegradeConfig(high_busy_jobs=1),
        worker_timeout_s=120,
    )
    backend = HarnessBackend(config)
    governor = Governor(GovernorConfig(max_inflight=8))
    await backend.start(governor)
    try:
        yield backend, governor
    finally:
        await backend.aclose()


def reference(backend: HarnessBackend, prompt: str, max_tokens: int) -> str:
    assert backend.engine is not None
    out = backend.engine.model.greedy_reference(list(prompt.encode()), max_tokens)
    return bytes(out).decode("utf-8", errors="replace")


async def wait_for(condition: Callable[[], bool], timeout_s: float = 120.0) -> None:
    with anyio.fail_after(timeout_s):
        while not condition():  # noqa: ASYNC110 - state of other threads and processes
            await anyio.sleep(0.02)


def script(backend: HarnessBackend, n: int, **sample: Any) -> None:
    """``n`` finished requests of this shape, as the planner would have seen them."""
    assert backend.planner is not None
    with backend._metrics_lock:
        for _ in range(n):
            backend.planner.planner.record(time.monotonic(), **sample)


async def test_low_priority_prefills_locally_while_a_worker_serves_high(
    harness: tuple[HarnessBackend, Governor],
) -> None:
    backend, _ = harness
    high_prompt = "high priority, long enough to keep the worker busy for a while. " * 24
    low_prompt = "low priority: it would go to the worker, but high has it. " * 4
    before = backend.stats()["router"]["decisions"]
    results: dict[str, Any] = {}

    async def one(name: str, body: str, priority: Priority) -> None:
        work = Work(id=name, body=body, params={"max_tokens": 6}, priority=priority)
        results[name] = await backend.execute(work, None)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            # Both reach the engine thread before the worker can have finished the first.
            tg.start_soon(one, "high", high_prompt, Priority.HIGH)
            tg.start_soon(one, "low", low_prompt, Priority.LOW)
    after = backend.stats()
    decisions = after["router"]["decisions"]
    assert decisions["long"] - before["long"] == 1  # the high one, offloaded
    assert decisions["yield_to_high"] - before["yield_to_high"] == 1
    assert after["degrade"]["local_prefills"] >= 1
    assert results["high"]["text"] == reference(backend, high_prompt, 6)
    assert results["low"]["text"] == reference(backend, low_prompt, 6)


async def test_the_planner_starts_and_stops_prefill_worker_processes(
    harness: tuple[HarnessBackend, Governor],
) -> None:
    backend, governor = harness
    assert backend.disagg is not None
    pool = backend.disagg.pool

    def active() -> list[int]:
        return [w.process.pid for w in pool.workers if w.active]

    first = active()
    assert len(first) == 1
    # Long prompts whose first token comes too late: the planner adds a prefill worker.
    script(backend, 3, ttft_ms=20_000.0, tpot_ms=1.0, prompt_tokens=500)
    await wait_for(lambda: len(active()) == 2)
    new_pid = next(pid for pid in active() if pid not in first)
    new_worker = next(w for w in pool.workers if w.process.pid == new_pid)
    assert new_worker.process.poll() is None
    # The new worker serves: every long prompt's KV now comes from one of two processes.
    work = Work(id="x", body=LONG, params={"max_tokens": 5})
    with anyio.fail_after(120):
        assert (await backend.execute(work, None))["text"] == reference(backend, LONG, 5)

    # Then short prompts with slow tokens: the workers give their cores back to decode,
    # down to none (colocated serving), and then the decode batch shrinks.
    script(backend, 3, ttft_ms=1.0, tpot_ms=20_000.0, prompt_tokens=10)
    await wait_for(lambda: len(active()) == 1)
    script(backend, 3, ttft_ms=1.0, tpot_ms=20_000.0, prompt_tokens=10)
    await wait_for(lambda: not active())
    # Retired workers drain, are told to stop, and their processes exit.
    await wait_for(lambda: all(w.process.poll() is not None for w in pool.workers))
    script(backend, 3, ttft_ms=1.0, tpot_ms=20_000.0, prompt_tokens=10)
    assert backend.engine is not None
    engine = backend.engine
    await wait_for(lambda: engine.scheduler.config.max_num_seqs == 6 and governor.capacity == 6)

    stats = backend.stats()
    planner = stats["planner"]
    assert [(d["action"], d["target"], d["reason"]) for d in planner["decisions"]] == [
        ("start_prefill_worker", 2, "ttft_over_objective"),
        ("stop_prefill_worker", 1, "reassign_to_decode"),
        ("stop_prefill_worker", 0, "reassign_to_decode"),
        ("set_decode_seqs", 6, "tpot_over_objective"),
    ]
    assert planner["applied"] == 4
    assert planner["failures"] == 0
    assert stats["prefill_workers_started"] == 2
    assert stats["prefill_workers_stopped"] == 2
    assert stats["prefill_workers_dead"] == 0  # a retirement is not a death
    assert {w["state"] for w in stats["prefill_workers"]} == {"stopped"}
    # Colocated now: a long prompt is prefilled here, with the same output.
    before = stats["router"]["decisions"]["no_worker"]
    fresh = "a prompt no cache has seen, long enough to be offloaded if it could be. " * 3
    with anyio.fail_after(120):
        result = await backend.execute(Work(id="y", body=fresh, params={"max_tokens": 5}), None)
    assert result["text"] == reference(backend, fresh, 5)
    assert backend.stats()["router"]["decisions"]["no_worker"] == before + 1

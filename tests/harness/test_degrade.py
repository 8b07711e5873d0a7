"""Graceful degradation: the pure policy on a fake clock, then wired into the backend."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from yieldgate.harness.backend import HarnessBackend, HarnessConfig
from yieldgate.harness.degrade import DegradeConfig, DegradeLevel, Degrader, Verdict
from yieldgate.harness.engine import EngineConfig
from yieldgate.harness.qos import EngineLoad
from yieldgate.protocol import Priority
from yieldgate.server.backends import Work
from yieldgate.server.governor import AdmissionRequest, Governor, GovernorConfig, Rejection

LOW, NORMAL, HIGH = Priority.LOW, Priority.NORMAL, Priority.HIGH


def degrader(**overrides: object) -> Degrader:
    return Degrader(DegradeConfig(sustain_s=1.0, **overrides))  # type: ignore[arg-type]


def test_nothing_applies_before_any_overload() -> None:
    policy = degrader()
    assert policy.verdict(LOW, 0.0) == Verdict()
    policy.observe(0.0, 0.5)
    assert policy.level(10.0) is None
    # A long prompt alone on an idle server reads exactly 1: never an overload.
    policy.observe(11.0, 1.0)
    assert policy.level(20.0) is None
    assert policy.verdict(LOW, 10.0) == Verdict()


def test_a_burst_shorter_than_sustain_is_absorbed() -> None:
    policy = degrader()
    policy.observe(0.0, 1.5)
    policy.observe(0.5, 1.5)
    assert policy.verdict(LOW, 0.9) == Verdict()  # over, but not for sustain_s yet
    policy.observe(0.95, 0.8)  # one reading under the objective resets the timer
    policy.observe(1.2, 1.5)
    assert policy.verdict(LOW, 2.0) == Verdict()
    assert policy.verdict(LOW, 2.2).max_tokens == 8


def test_sustained_overload_shortens_then_rejects() -> None:
    """Scripted traffic: the pressure climbs, stays, then falls."""
    policy = degrader()
    script = [(0.0, 0.5), (1.0, 1.2), (1.5, 1.4), (2.0, 1.6), (2.5, 2.5), (3.0, 3.0), (3.5, 2.6)]
    verdicts = []
    for now, pressure in script:
        policy.observe(now, pressure)
        verdicts.append(policy.verdict(LOW, now))
        policy.record(verdicts[-1])
    assert [v.level for v in verdicts] == [None, None, None, 0, 0, 0, 1]
    assert verdicts[3] == Verdict(max_tokens=8, level=0)
    assert verdicts[-1] == Verdict(reject=True, level=1)
    # Work already admitted is never rejected afterwards: it gets the deepest cap.
    assert policy.cap(LOW, 3.5) == Verdict(max_tokens=8, level=0)
    assert policy.cap(HIGH, 3.5) == Verdict()
    # The overload ends: one reading below level 0 clears both levels at once.
    policy.observe(4.0, 0.9)
    assert policy.verdict(LOW, 4.0) == Verdict()
    stats = policy.stats(4.0)
    assert stats["shortened"] == 3
    assert stats["rejected"] == 1
    assert stats["level"] == -1


def test_only_the_degraded_priorities_are_touched() -> None:
    policy = degrader(priorities=frozenset({LOW, NORMAL}))
    policy.observe(0.0, 5.0)
    assert policy.verdict(HIGH, 5.0) == Verdict()
    assert policy.verdict(NORMAL, 5.0).reject
    low_only = degrader()
    low_only.observe(0.0, 5.0)
    assert low_only.verdict(NORMAL, 5.0) == Verdict()


def test_low_priority_prefills_locally_while_workers_serve_high() -> None:
    policy = degrader(high_busy_jobs=2)
    assert not policy.prefill_locally(LOW, high_jobs_queued=1)
    assert policy.prefill_locally(LOW, high_jobs_queued=2)
    assert not policy.prefill_locally(NORMAL, high_jobs_queued=5)
    assert not policy.prefill_locally(HIGH, high_jobs_queued=5)
    off = degrader(local_prefill=False)
    assert not off.prefill_locally(LOW, high_jobs_queued=5)
    policy.record_local_prefill()
    assert policy.stats(0.0)["local_prefills"] == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"pressure": 0.0, "max_tokens": 4}, "pressure"),
        ({"pressure": float("nan"), "max_tokens": 4}, "pressure"),
        ({"pressure": 1.0}, "exactly one"),
        ({"pressure": 1.0, "max_tokens": 4, "reject": True}, "exactly one"),
        ({"pressure": 1.0, "max_tokens": 0}, "max_tokens"),
        ({"pressure": True, "max_tokens": 4}, "pressure"),
    ],
)
def test_bad_levels_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DegradeLevel(**kwargs)  # type: ignore[arg-type]


def levels(*pairs: tuple[float, int | None]) -> dict[str, object]:
    return {
        "levels": tuple(DegradeLevel(pressure=p, max_tokens=n, reject=n is None) for p, n in pairs)
    }


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"priorities": frozenset({HIGH})}, "high priority"),
        ({"priorities": {LOW}}, "frozenset"),
        ({"high_busy_jobs": 0}, "high_busy_jobs"),
        ({"sustain_s": -1.0}, "sustain_s"),
        ({"levels": [DegradeLevel(pressure=1.0, max_tokens=4)]}, "tuple"),
        (levels((2.0, 4), (1.0, 2)), "increasing"),
        (levels((1.0, None), (2.0, 2)), "last"),
        (levels((1.0, 4), (2.0, 8)), "more tokens"),
    ],
)
def test_bad_configs_are_refused(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DegradeConfig(**kwargs)  # type: ignore[arg-type]


def test_a_bad_reading_is_refused() -> None:
    with pytest.raises(ValueError, match="pressure"):
        degrader().observe(0.0, float("inf"))


# -- in the backend ------------------------------------------------------------


@pytest.fixture
async def harness() -> AsyncIterator[HarnessBackend]:
    config = HarnessConfig(
        engine=EngineConfig(device="cpu", num_blocks=128),
        degrade=DegradeConfig(sustain_s=0.5),
    )
    backend = HarnessBackend(config)
    await backend.start(Governor(GovernorConfig(max_inflight=4)))
    try:
        yield backend
    finally:
        await backend.aclose()


@pytest.mark.anyio
async def test_sustained_overload_cuts_low_priority_output_and_says_so(
    harness: HarnessBackend,
) -> None:
    assert harness.degrader is not None
    assert harness.engine is not None
    # Scripted: the pressure has been 1.5 for a second (level 0: at most 8 tokens).
    harness.degrader.observe(time.monotonic() - 1.0, 1.5)
    prompt = "degrade me"
    chunks: list[Any] = []

    async def emit(data: Any) -> None:
        chunks.append(data)

    low = Work(id="l", body=prompt, params={"max_tokens": 32}, priority=LOW, stream=True)
    with anyio.fail_after(60):
        result = await harness.execute(low, emit)
        normal = await harness.execute(Work(id="n", body=prompt, params={"max_tokens": 32}), None)
    expected = {"max_tokens": 8, "requested_max_tokens": 32, "level": 0, "reason": "overload"}
    assert result["degraded"] == expected
    assert result["completion_tokens"] == 8
    assert result["finish_reason"] == "length"
    reference = harness.engine.model.greedy_reference(list(prompt.encode()), 8)
    assert result["token_ids"] == reference
    assert chunks[0]["degraded"] == expected  # a stream learns it with its first token
    assert all("degraded" not in chunk for chunk in chunks[1:])
    assert "degraded" not in normal
    assert normal["completion_tokens"] == 32
    # A request that asked for no more than the cap is not degraded at all.
    small = Work(id="s", body=prompt, params={"max_tokens": 4}, priority=LOW)
    with anyio.fail_after(60):
        assert "degraded" not in await harness.execute(small, None)
    assert harness.stats()["degrade"]["shortened"] == 1


@pytest.mark.anyio
@pytest.mark.parametrize(
    "load",
    [EngineLoad((5000, 5000, 5000), 0, 0), EngineLoad((0, 0, 0), 1, 5000)],
    ids=["queued-prompts", "steps-behind-swapped-sequences"],
)
async def test_the_admission_check_reads_pressure_and_rejects_at_the_last_level(
    harness: HarnessBackend, load: EngineLoad
) -> None:
    assert harness.qos is not None
    estimator = harness.qos.estimator
    # Seeded measurements and the load the engine thread would publish: 5,000
    # prompt tokens ahead at 1 ms each, or 5,000 decode steps before a new prompt
    # is admitted at all (sequences swapped out), against low's 500 ms.
    estimator.prefill_ms_per_token = 1.0
    estimator.decode_step_ms = 1.0
    harness._load_now = load

    def check(priority: Priority) -> Rejection | None:
        return harness._check_slo(
            AdmissionRequest(priority=priority, body="x", params={}, inflight=0, capacity=4)
        )

    assert harness.degrader is not None
    # Scripted: readings above every level for the last 0.6 s (sustain_s is 0.5).
    harness.degrader.observe(time.monotonic() - 0.6, 10.0)
    rejection = check(LOW)
    assert rejection is not None
    assert rejection.retry_hint_ms == 5001 - 500
    # The check was a reading too: the estimate over the low objective.
    assert harness.degrader.stats(time.monotonic())["pressure"] == pytest.approx(5001 / 500)
    assert check(NORMAL) is None  # not degraded, and plain QoS is off
    assert check(HIGH) is None
    assert harness.stats()["degrade"]["rejected"] == 1

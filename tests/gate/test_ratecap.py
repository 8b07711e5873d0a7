"""The rate cap: pacing on aiolimiter, and a ramp that restarts on cold start."""

from __future__ import annotations

import anyio
import pytest

from yieldgate.gate._ratecap import RateCap, RatePolicy

pytestmark = pytest.mark.anyio


async def test_paces_attempt_starts() -> None:
    cap = RateCap(RatePolicy(per_s=10), anyio.current_time)
    start = anyio.current_time()
    for _ in range(21):
        await cap.acquire()
    assert anyio.current_time() - start == pytest.approx(2.0, abs=0.15)


async def test_ramp_rises_linearly_to_the_top() -> None:
    cap = RateCap(RatePolicy(per_s=20, ramp_from_per_s=2, ramp_s=10), anyio.current_time)
    assert cap.rate_now() == pytest.approx(2)
    starts: list[float] = []
    t0 = anyio.current_time()
    while anyio.current_time() - t0 < 12:
        await cap.acquire()
        starts.append(anyio.current_time() - t0)
    first_second = sum(1 for t in starts if t < 1)
    last_second = sum(1 for t in starts if 11 <= t < 12)
    assert first_second <= 4
    assert 17 <= last_second <= 21
    assert cap.rate_now() == pytest.approx(20)


async def test_cold_start_restarts_the_ramp() -> None:
    cap = RateCap(RatePolicy(per_s=20, ramp_from_per_s=1, ramp_s=5), anyio.current_time)
    await anyio.sleep(10)
    assert cap.rate_now() == pytest.approx(20)
    cap.restart_ramp()
    assert cap.rate_now() == pytest.approx(1)


def test_policy_validation() -> None:
    for kwargs in (
        {"per_s": 0},
        {"per_s": 1, "burst": 0},
        {"per_s": 1, "ramp_s": -1},
        {"per_s": 1, "ramp_from_per_s": 2},
    ):
        with pytest.raises(ValueError, match="rate"):
            RatePolicy(**kwargs)  # type: ignore[arg-type]

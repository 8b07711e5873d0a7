"""The rate cap: a token bucket that paces starts, and a ramp that restarts on cold start."""

from __future__ import annotations

import anyio
import pytest

from yieldgate.gate._ratecap import RateCap, RatePolicy

pytestmark = pytest.mark.anyio


async def take_rate(cap: RateCap) -> None:
    """A start from the cap, sleeping until ``next_at`` says one is free."""
    while not cap.try_take(anyio.current_time()):
        now = anyio.current_time()
        await anyio.sleep(cap.next_at(now) - now)


async def test_paces_attempt_starts() -> None:
    cap = RateCap(RatePolicy(per_s=10), anyio.current_time)
    start = anyio.current_time()
    for _ in range(21):
        await take_rate(cap)
    assert anyio.current_time() - start == pytest.approx(2.0, abs=0.15)


async def test_ramp_rises_linearly_to_the_top() -> None:
    cap = RateCap(RatePolicy(per_s=20, ramp_from_per_s=2, ramp_s=10), anyio.current_time)
    assert cap.rate_now() == pytest.approx(2)
    starts: list[float] = []
    t0 = anyio.current_time()
    while anyio.current_time() - t0 < 12:
        await take_rate(cap)
        starts.append(anyio.current_time() - t0)
    first_second = sum(1 for t in starts if t < 1)
    last_second = sum(1 for t in starts if 11 <= t < 12)
    assert first_second <= 4
    assert 17 <= last_second <= 21
    assert cap.rate_now() == pytest.approx(20)


async def test_cold_start_restarts_the_ramp() -> None:
    cap = RateCap(RatePolicy(per_s=20, ramp_from_per_s=1, ramp_s=5), anyio.current_time)
    await anyio.sleep(10)
    assert cap.rate_now() == pytest.approx(1)  # the ramp begins with the first start
    assert cap.try_take(anyio.current_time())
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


async def start_times(cap: RateCap, callers: int, every_s: float = 0.0) -> list[float]:
    """Start ``callers`` callers, one every ``every_s``; when each got through, from now."""
    starts: list[float] = []
    t0 = anyio.current_time()

    async def one() -> None:
        await take_rate(cap)
        starts.append(anyio.current_time() - t0)

    async with anyio.create_task_group() as tg:
        for _ in range(callers):
            tg.start_soon(one)
            if every_s:
                await anyio.sleep(every_s)
    return starts


async def test_a_concurrent_burst_follows_the_ramp() -> None:
    cap = RateCap(RatePolicy(per_s=10, ramp_from_per_s=1, ramp_s=30), anyio.current_time)
    starts = await start_times(cap, 300)
    per_window = [sum(1 for t in starts if w <= t < w + 10) for w in (0, 10, 20)]
    # The ramp allows about 1->4, 4->7 and 7->10 starts per second in these windows.
    assert 15 <= per_window[0] <= 35
    assert 45 <= per_window[1] <= 65
    assert 75 <= per_window[2] <= 95
    assert max(starts) < 45  # and it did ramp: 300 starts, not 300 s at 1/s


async def test_steady_arrivals_never_exceed_the_cap() -> None:
    cap = RateCap(RatePolicy(per_s=10, ramp_from_per_s=1, ramp_s=30), anyio.current_time)
    starts = await start_times(cap, 800, every_s=0.05)  # 20 per second offered, for 40 s
    for window in range(0, 40, 5):
        count = sum(1 for t in starts if window <= t < window + 5)
        allowed = 5 * min(10, 1 + 9 * (window + 5) / 30) + 1
        assert count <= allowed, (window, count, allowed)


async def test_restart_slows_callers_already_queued() -> None:
    cap = RateCap(RatePolicy(per_s=20, ramp_from_per_s=1, ramp_s=10), anyio.current_time)
    await anyio.sleep(20)
    starts: list[float] = []

    async def one() -> None:
        await take_rate(cap)
        starts.append(anyio.current_time())

    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(one)
        await anyio.sleep(0.5)  # about ten have started at 20/s
        restart_at = anyio.current_time()
        cap.restart_ramp()
    after = [t - restart_at for t in starts if t > restart_at]
    assert sum(1 for t in after if t < 2) <= 5  # not 40 more at full speed

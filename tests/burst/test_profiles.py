"""Arrival profiles: shapes, mean rates, parsing."""

from __future__ import annotations

import itertools
import statistics

import pytest

from yieldgate.burst import ArrivalProfile


def test_all_at_once_sends_everything_at_zero() -> None:
    assert ArrivalProfile.all_at_once().offsets(5) == [0.0] * 5
    assert ArrivalProfile.parse("burst") == ArrivalProfile.all_at_once()


@pytest.mark.parametrize("profile", ["poisson:50", "gamma:50:0.5", "gamma:50:4"])
def test_gamma_family_keeps_the_mean_rate(profile: str) -> None:
    offsets = ArrivalProfile.parse(profile).offsets(4000, seed=3)
    assert offsets[0] == 0.0
    assert offsets == sorted(offsets)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.mean(gaps) == pytest.approx(1 / 50, rel=0.1)


def test_burstiness_below_one_is_burstier() -> None:
    def cv(profile: str) -> float:
        offsets = ArrivalProfile.parse(profile).offsets(4000, seed=1)
        gaps = [b - a for a, b in itertools.pairwise(offsets)]
        return statistics.stdev(gaps) / statistics.mean(gaps)

    assert cv("gamma:50:0.25") > cv("poisson:50") > cv("gamma:50:4")
    assert cv("poisson:50") == pytest.approx(1.0, abs=0.1)


def test_ramp_rises_then_holds() -> None:
    profile = ArrivalProfile.ramp(2, 100, 10)
    offsets = profile.offsets(3000, seed=0)
    assert offsets == sorted(offsets)
    first = sum(1 for t in offsets if t < 2)
    last = sum(1 for t in offsets if 8 <= t < 10)
    assert last > 4 * first
    # After the ramp: the end rate.
    after = [t for t in offsets if t >= 10]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert statistics.mean(gaps) == pytest.approx(1 / 100, rel=0.15)
    # (2 + 100) / 2 * 10 = 510 arrivals expected during the ramp.
    assert sum(1 for t in offsets if t < 10) == pytest.approx(510, rel=0.15)


def test_same_seed_same_offsets() -> None:
    profile = ArrivalProfile.gamma(10, 0.5)
    assert profile.offsets(50, seed=7) == profile.offsets(50, seed=7)
    assert profile.offsets(50, seed=7) != profile.offsets(50, seed=8)


@pytest.mark.parametrize("spec", ["all-at-once", "poisson:12.5", "gamma:3:0.5", "ramp:1:10:5"])
def test_parse_and_describe_round_trip(spec: str) -> None:
    assert ArrivalProfile.parse(spec).describe() == spec


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("sometimes", "unknown profile"),
        ("poisson", "takes 1 number"),
        ("poisson:x", "must be numbers"),
        ("poisson:0", "rate must be"),
        ("gamma:5:-1", "burstiness must be"),
        ("ramp:1:5:0", "ramp_s must be"),
    ],
)
def test_bad_profiles_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArrivalProfile.parse(spec)

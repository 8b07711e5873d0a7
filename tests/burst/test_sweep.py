"""Sweeps: the AXIS=VALUES syntax and what a point changes in the configuration."""

from __future__ import annotations

import pytest

from yieldgate.burst import ArrivalProfile, BurstConfig, Sweep


@pytest.mark.parametrize(
    ("spec", "axis", "values"),
    [
        ("rate=1,2,4,8", "rate", (1, 2, 4, 8)),
        (" Rate = 0.5 , 3 ", "rate", (0.5, 3)),
        ("rate=1:16:x2", "rate", (1, 2, 4, 8, 16)),
        ("rate=1:20:x2", "rate", (1, 2, 4, 8, 16)),
        ("rate=2:10:+2", "rate", (2, 4, 6, 8, 10)),
        ("rate=0.1:0.5:+0.1", "rate", (0.1, 0.2, 0.3, 0.4, 0.5)),
        ("concurrency=4:16:+4", "concurrency", (4, 8, 12, 16)),
        ("concurrency=1,64", "concurrency", (1, 64)),
        ("rate=3:3:x2", "rate", (3,)),
    ],
)
def test_good_sweeps(spec: str, axis: str, values: tuple[float, ...]) -> None:
    sweep = Sweep.parse(spec)
    assert sweep.axis == axis
    assert sweep.values == pytest.approx(values)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("rate", "use AXIS=VALUES"),
        ("rate=", "use AXIS=VALUES"),
        ("speed=1,2", "unknown axis 'speed'"),
        ("rate=1,x", "'x' is not a number"),
        ("rate=0,1", "values must be finite numbers > 0"),
        ("rate=1,1", "must differ"),
        ("rate=1:8", "a range is START:STOP:"),
        ("rate=1:8:2", "the step must be \\+N"),
        ("rate=1:8:x1", "multiplying step must be > 1"),
        ("rate=8:1:+1", "STOP is below START"),
        ("rate=1:1000:+1", "more than 100 points"),
        ("concurrency=1.5,2", "whole number"),
    ],
)
def test_bad_sweeps_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sweep.parse(spec)


def test_describe() -> None:
    assert Sweep.parse("rate=1:4:x2").describe() == "rate=1,2,4"


def test_a_point_changes_only_the_swept_value() -> None:
    base = BurstConfig(target="tcp://", serve_args=(), profile=ArrivalProfile.gamma(1, 0.5))
    point = Sweep.parse("rate=8").point(base, 8)
    assert point.profile == ArrivalProfile.gamma(8, 0.5)
    assert point.seed == base.seed
    assert point.concurrency is None
    capped = Sweep.parse("concurrency=3").point(base, 3)
    assert capped.concurrency == 3
    assert capped.profile == base.profile


def test_a_ramp_cannot_be_rate_swept() -> None:
    base = BurstConfig(target="tcp://", serve_args=(), profile=ArrivalProfile.ramp(1, 2, 3))
    with pytest.raises(ValueError, match="rate sweep needs a poisson or gamma"):
        Sweep.parse("rate=4").point(base, 4)

"""Arrival profiles: shapes, mean rates, parsing."""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path

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


@pytest.mark.parametrize(
    "spec", ["all-at-once", "poisson:12.5", "gamma:3:0.5", "ramp:1:10:5", "exp-ramp:1:10:5"]
)
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
        ("exp-ramp:0:5:1", "start_rate must be"),
        ("exp-ramp:1:5", "takes 3 number"),
    ],
)
def test_bad_profiles_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ArrivalProfile.parse(spec)


def test_exponential_ramp_grows_by_a_factor_then_holds() -> None:
    profile = ArrivalProfile.parse("exp-ramp:5:80:8")
    assert profile.describe() == "exp-ramp:5:80:8"
    offsets = profile.offsets(4000, seed=2)
    assert offsets == sorted(offsets)
    # The rate doubles every 2 s: each 2 s of the ramp holds about twice the one before.
    counts = [sum(1 for t in offsets if 2 * k <= t < 2 * (k + 1)) for k in range(4)]
    assert counts[3] > 4 * counts[0]
    # 5 * 8 / ln 16 * (16 - 1) = 216 arrivals expected during the ramp.
    assert sum(1 for t in offsets if t < 8) == pytest.approx(216, rel=0.15)
    # A linear ramp between the same rates sends (5 + 80) / 2 * 8 = 340: more, earlier.
    linear = ArrivalProfile.ramp(5, 80, 8).offsets(4000, seed=2)
    assert sum(1 for t in linear if t < 8) > sum(1 for t in offsets if t < 8)
    after = [t for t in offsets if t >= 8]
    gaps = [b - a for a, b in itertools.pairwise(after)]
    assert statistics.mean(gaps) == pytest.approx(1 / 80, rel=0.15)


def test_a_flat_exponential_ramp_is_poisson_at_that_rate() -> None:
    offsets = ArrivalProfile.exp_ramp(40, 40, 5).offsets(2000, seed=4)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert statistics.mean(gaps) == pytest.approx(1 / 40, rel=0.1)


def test_trace_replays_its_offsets_in_order(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"offset_s": 0.5, "prompt": "b", "max_tokens": 2}\n'
        "\n"
        '{"offset_s": 0.0, "prompt_chars": 40}\n'
        '{"offset_s": 0.5, "prompt": "c"}\n'
        '{"offset_s": 2.25}\n'
    )
    profile = ArrivalProfile.parse(f"trace:{trace}")
    assert profile.kind == "trace"
    assert profile.describe() == f"trace:{trace}"
    assert profile.as_dict()["trace_requests"] == 4
    # Sorted by offset, ties in file order; offsets as given, whatever the seed.
    assert profile.offsets(4, seed=1) == profile.offsets(4, seed=9) == [0.0, 0.5, 0.5, 2.25]
    assert [e.prompt for e in profile.entries] == [None, "b", "c", None]
    assert [e.max_tokens for e in profile.entries] == [None, 2, None, None]
    assert profile.entries[0].prompt_chars == 40
    assert profile.offsets(2) == [0.0, 0.5]
    with pytest.raises(ValueError, match="has 4 requests, not 5"):
        profile.offsets(5)
    with pytest.raises(ValueError, match="rate sweep needs a poisson or gamma"):
        profile.with_rate(3)
    with pytest.raises(ValueError, match="takes a path"):
        ArrivalProfile.parse("trace:")


def test_with_rate_keeps_the_shape() -> None:
    assert ArrivalProfile.all_at_once().with_rate(4) == ArrivalProfile.poisson(4)
    assert ArrivalProfile.poisson(1).with_rate(4) == ArrivalProfile.poisson(4)
    assert ArrivalProfile.gamma(1, 0.5).with_rate(4) == ArrivalProfile.gamma(4, 0.5)
    with pytest.raises(ValueError, match="not 'exp-ramp'"):
        ArrivalProfile.exp_ramp(1, 2, 3).with_rate(4)

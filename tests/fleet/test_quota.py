"""The quota buckets' scripts: take, refund, observe, finished.

Buckets with ``rate=0`` never refill, so their arithmetic is exact whatever
the time; refills are checked with inequalities that hold however long the
machine takes between calls.
"""

from __future__ import annotations

import math
import time
from typing import Any

import pytest
import redis

from tests.fleet.conftest import Either, wait_for
from yieldgate.fleet import BucketShape

pytestmark = pytest.mark.anyio

UP = "api.example"


def bucket(admin: redis.Redis, gate: str, key: str) -> dict[str, float]:
    raw: dict[bytes, bytes] = admin.hgetall(f"yieldgate:{gate}:{{{UP}}}:quota:{key}")  # type: ignore[assignment]
    return {k.decode(): float(v) for k, v in raw.items()}


async def test_a_take_creates_full_buckets_and_deducts_every_amount(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    take = await fleet.take(UP, [("requests", 1, 10, 0), ("tokens", 300, 1000, 0)])
    assert take is not None
    assert take.ok
    assert take.seq == 1
    assert take.wait_s == 0
    requests = bucket(admin, gate, "requests")
    assert requests == {
        "limit": 10,
        "rate": 0,
        "level": 9,
        "updated": requests["updated"],
        "unseen": 1,
    }
    tokens = bucket(admin, gate, "tokens")
    assert (tokens["limit"], tokens["level"], tokens["unseen"]) == (1000, 700, 300)
    again = await fleet.take(UP, [("requests", 1, 10, 0), ("tokens", 300, 1000, 0)])
    assert again is not None
    assert again.seq == 2
    assert bucket(admin, gate, "tokens")["level"] == 400


async def test_a_take_is_all_or_nothing(fleet: Either, admin: redis.Redis, gate: str) -> None:
    await fleet.take(UP, [("requests", 1, 10, 0), ("tokens", 900, 1000, 0)])
    refused = await fleet.take(UP, [("requests", 1, 10, 0), ("tokens", 200, 1000, 0)])
    assert refused is not None
    assert not refused.ok
    assert refused.seq == 0
    assert refused.wait_s == math.inf  # a bucket that never refills
    assert bucket(admin, gate, "requests")["level"] == 9
    assert bucket(admin, gate, "tokens")["level"] == 100
    assert bucket(admin, gate, "tokens")["unseen"] == 900
    # The refused take drew no send number.
    take = await fleet.take(UP, [("tokens", 100, 1000, 0)])
    assert take is not None
    assert (take.ok, take.seq) == (True, 2)


async def test_an_existing_bucket_keeps_its_own_limit_and_rate(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    await fleet.take(UP, [("tokens", 10, 100, 0)])
    await fleet.take(UP, [("tokens", 10, 5000, 50)])
    assert bucket(admin, gate, "tokens")["limit"] == 100
    assert bucket(admin, gate, "tokens")["rate"] == 0
    assert bucket(admin, gate, "tokens")["level"] == 80


async def test_the_wait_is_the_longest_refill_needed(fleet: Either) -> None:
    start = time.monotonic()
    await fleet.take(UP, [("requests", 10, 10, 1.0), ("tokens", 1000, 1000, 100.0)])
    refused = await fleet.take(UP, [("requests", 2, 10, 1.0), ("tokens", 500, 1000, 100.0)])
    elapsed = time.monotonic() - start
    assert refused is not None
    assert not refused.ok
    # tokens need 5 s of refill, requests 2 s; less what has refilled since.
    assert 5.0 - elapsed - 1e-6 <= refused.wait_s <= 5.0
    # An amount past the whole limit waits for the whole bucket: a learnt limit (a
    # reading, or a guess) paces, never refuses.
    past = await fleet.take(UP, [("tokens", 1001, 1000, 100.0)])
    elapsed = time.monotonic() - start
    assert past is not None
    assert not past.ok
    assert 10.0 - elapsed - 1e-6 <= past.wait_s <= 10.0


async def test_buckets_refill_at_their_rate_up_to_their_limit(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    start = time.monotonic()
    await fleet.take(UP, [("tokens", 100, 100, 200.0)])
    first = await fleet.take(UP, [("tokens", 50, 100, 200.0)])
    assert first is not None
    if not first.ok:  # a slow machine may have refilled 50 already
        assert first.wait_s <= 0.25

        async def fits() -> bool:
            take = await fleet.take(UP, [("tokens", 50, 100, 200.0)])
            return take is not None and take.ok

        await wait_for(fits)
    # 150 taken in all: at least 0.25 s of refill, as Redis counts time.
    assert time.monotonic() - start >= 0.25 - 0.05

    async def full() -> bool:
        refill = await fleet.take(UP, [("tokens", 0, 100, 200.0)])
        return refill is not None and bucket(admin, gate, "tokens")["level"] == 100

    await wait_for(full)  # never past its limit


async def test_a_refund_gives_back_up_to_the_limit(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    await fleet.take(UP, [("tokens", 30, 100, 0)])
    assert await fleet.refund(UP, [("tokens", 30)]) is True
    assert bucket(admin, gate, "tokens")["level"] == 100
    assert bucket(admin, gate, "tokens")["unseen"] == 0
    await fleet.take(UP, [("tokens", 10, 100, 0)])
    await fleet.refund(UP, [("tokens", 50)])
    assert bucket(admin, gate, "tokens")["level"] == 100  # capped
    assert bucket(admin, gate, "tokens")["unseen"] == 0  # floored
    # A bucket that does not exist is not made by a refund.
    assert await fleet.refund(UP, [("requests", 1)]) is True
    assert bucket(admin, gate, "requests") == {}


async def test_a_reading_is_applied_less_what_is_still_unseen(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    a = await fleet.take(UP, [("tokens", 30, 100, 0)])
    b = await fleet.take(UP, [("tokens", 20, 100, 0)])
    assert a is not None
    assert b is not None
    assert bucket(admin, gate, "tokens")["level"] == 50
    observe: dict[str, Any] = {"limit": 100, "rate": 0}
    # a's reading: the provider had counted a (80 left), not b (still unseen).
    assert await fleet.observe(UP, "tokens", remaining=80, amount=30, seq=a.seq, **observe)
    state = bucket(admin, gate, "tokens")
    assert (state["level"], state["unseen"], state["applied"]) == (60, 20, a.seq)
    # b's reading sets the level, up or down.
    await fleet.observe(UP, "tokens", remaining=90, amount=20, seq=b.seq, **observe)
    state = bucket(admin, gate, "tokens")
    assert (state["level"], state["unseen"], state["applied"]) == (90, 0, b.seq)


async def test_an_older_sends_reading_may_only_lower_the_level(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    a = await fleet.take(UP, [("tokens", 10, 100, 0)])
    b = await fleet.take(UP, [("tokens", 10, 100, 0)])
    assert a is not None
    assert b is not None
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=85, amount=10, seq=b.seq)
    state = bucket(admin, gate, "tokens")
    assert (state["level"], state["unseen"], state["applied"]) == (75, 10, b.seq)
    # a answered late, with more left than b said: ignored, but a is no longer unseen.
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=95, amount=10, seq=a.seq)
    state = bucket(admin, gate, "tokens")
    assert (state["level"], state["unseen"], state["applied"]) == (75, 0, b.seq)
    # A late reading with less left lowers it.
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=60, amount=0, seq=a.seq)
    assert bucket(admin, gate, "tokens")["level"] == 60
    assert bucket(admin, gate, "tokens")["applied"] == b.seq


async def test_a_reading_sets_limit_and_rate_and_creates_a_missing_bucket(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    await fleet.observe(UP, "tokens", limit=5000, rate=50.0, remaining=4000, amount=0, seq=0)
    state = bucket(admin, gate, "tokens")
    assert (state["limit"], state["rate"], state["level"], state["unseen"]) == (5000, 50, 4000, 0)
    start = time.monotonic()
    await fleet.observe(UP, "tokens", limit=6000, rate=100.0, remaining=5500, amount=0, seq=1)
    state = bucket(admin, gate, "tokens")
    assert (state["limit"], state["rate"], state["level"]) == (6000, 100, 5500)
    # A stale reading lowers to at most the level refilled to now, at the new rate.
    await fleet.observe(UP, "tokens", limit=6000, rate=100.0, remaining=5900, amount=0, seq=1)
    level = bucket(admin, gate, "tokens")["level"]
    assert 5500 <= level <= min(5900, 5500 + 100.0 * (time.monotonic() - start) + 1e-6)


async def test_a_reading_with_its_resource_records_the_buckets_shape(fleet: Either) -> None:
    assert await fleet.shapes(UP) == {}
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=50, amount=0, seq=0)
    assert await fleet.shapes(UP) == {}  # no resource given: no shape
    await fleet.observe(
        UP, "tokens", limit=5000, rate=50.0, remaining=4000, amount=0, seq=1, resource="tokens"
    )
    await fleet.observe(
        UP, "rpm", limit=60, rate=1.0, remaining=60, amount=0, seq=1, resource="requests"
    )
    assert await fleet.shapes(UP) == {
        "tokens": BucketShape("tokens", 5000, 50.0),
        "rpm": BucketShape("requests", 60, 1.0),
    }
    with pytest.raises(ValueError, match="resource"):
        await fleet.observe(UP, "x", limit=1, rate=0, remaining=1, amount=0, seq=1, resource="a b")


async def test_finished_takes_are_no_longer_unseen(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    await fleet.take(UP, [("requests", 1, 10, 0), ("tokens", 40, 100, 0)])
    assert await fleet.finished(UP, [("requests", 1), ("tokens", 40)]) is True
    state = bucket(admin, gate, "tokens")
    assert (state["level"], state["unseen"]) == (60, 0)  # the level is not given back
    await fleet.finished(UP, [("tokens", 40)])
    assert bucket(admin, gate, "tokens")["unseen"] == 0
    await fleet.finished(UP, [("other", 1)])
    assert bucket(admin, gate, "other") == {}


async def test_a_take_of_nothing_draws_a_send_number(fleet: Either) -> None:
    first = await fleet.take(UP, [])
    second = await fleet.take(UP, [])
    assert first is not None
    assert second is not None
    assert (first.ok, first.seq, second.seq) == (True, 1, 2)


async def test_the_sequence_never_falls_behind_a_reading_applied(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    for _ in range(3):
        take = await fleet.take(UP, [("tokens", 1, 100, 0)])
    assert take is not None
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=97, amount=1, seq=take.seq)
    admin.delete(f"yieldgate:{gate}:{{{UP}}}:seq")  # expired, or lost
    fresh = await fleet.take(UP, [("tokens", 1, 100, 0)])
    assert fresh is not None
    assert fresh.seq == 4  # not 1: its reading must not look stale
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=99, amount=1, seq=fresh.seq)
    # Applied as the newest reading: 99 less the two takes still unseen.
    assert bucket(admin, gate, "tokens")["level"] == 97
    # A reading with no take before it starts the sequence where it is.
    admin.delete(f"yieldgate:{gate}:{{{UP}}}:seq")
    await fleet.observe(UP, "tokens", limit=100, rate=0, remaining=98, amount=0, seq=7)
    assert admin.get(f"yieldgate:{gate}:{{{UP}}}:seq") == b"7"
    assert admin.pttl(f"yieldgate:{gate}:{{{UP}}}:seq") > 0


async def test_members_share_their_buckets(fleets: Any) -> None:
    a, b = fleets(member="a"), fleets(member="b")
    await a.take(UP, [("tokens", 60, 100, 0)])
    refused = await b.take(UP, [("tokens", 60, 100, 0)])
    assert refused is not None
    assert not refused.ok
    taken = await b.take(UP, [("tokens", 40, 100, 0)])
    assert taken is not None
    assert (taken.ok, taken.seq) == (True, 2)


async def test_bad_arguments_raise_before_any_round_trip(fleet: Either) -> None:
    with pytest.raises(ValueError, match="amount"):
        await fleet.take(UP, [("tokens", -1, 100, 0)])
    with pytest.raises(ValueError, match="limit"):
        await fleet.take(UP, [("tokens", 1, 0, 0)])
    with pytest.raises(ValueError, match="rate"):
        await fleet.take(UP, [("tokens", 1, 10, math.nan)])
    with pytest.raises(ValueError, match="braces"):
        await fleet.take("a{b}", [])
    with pytest.raises(ValueError, match="seq"):
        await fleet.observe(UP, "t", limit=1, rate=0, remaining=0, amount=0, seq=-1)


async def test_a_refused_take_names_each_bucket_that_had_no_room(fleet: Either) -> None:
    """So that a member holds back only the claims that spend from those (one model's
    bucket its model's calls), not every call of the upstream."""
    await fleet.take(UP, [("tokens@a", 900, 1000, 10.0)])
    wants = [("requests", 1, 100, 1.0), ("tokens@a", 200, 1000, 10.0), ("budget", 1, 5, 0.0)]
    await fleet.take(UP, [("budget", 5, 5, 0.0)])
    refused = await fleet.take(UP, wants)
    assert refused is not None
    assert (refused.ok, refused.seq) == (False, 0)
    assert [name for name, _ in refused.waits] == ["tokens@a", "budget"]
    waits = dict(refused.waits)
    assert 0 < waits["tokens@a"] <= 10.0  # 100 short at 10 a second
    assert waits["budget"] == math.inf  # never refills
    assert refused.wait_s == math.inf
    granted = await fleet.take(UP, [("requests", 1, 100, 1.0)])
    assert granted is not None
    assert (granted.ok, granted.waits) == (True, ())

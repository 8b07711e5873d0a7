"""The key layout: one hash tag per upstream, every key with an expiry."""

from __future__ import annotations

import pytest
import redis
from redis.crc import key_slot

from tests.fleet.conftest import Either
from yieldgate.fleet import Fleet
from yieldgate.fleet._keys import Keys
from yieldgate.gate import BreakerPolicy, RetryBudgetPolicy

pytestmark = pytest.mark.anyio

UP = "api.example:443"


def test_an_upstreams_keys_share_its_hash_tag() -> None:
    keys = Keys("app", "chat")
    assert keys.tag(UP) == "app:chat:{api.example:443}"
    for key in (keys.seq(UP), keys.holds(UP), keys.leases(UP), keys.bucket(UP, "x:tokens")):
        assert key.startswith("app:chat:{api.example:443}:")


@pytest.mark.parametrize(("prefix", "gate"), [("a{", "g"), ("a", "}g"), ("", "g"), ("a", "")])
def test_names_that_would_move_the_tag_are_refused(prefix: str, gate: str) -> None:
    with pytest.raises(ValueError, match=r"prefix|gate"):
        Fleet("redis://127.0.0.1:1", prefix=prefix, gate=gate)


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="budget_s"):
        Fleet("redis://127.0.0.1:1", gate="g", budget_s=0)
    with pytest.raises(ValueError, match="max_backoff_s"):
        Fleet("redis://127.0.0.1:1", gate="g", backoff_s=2.0, max_backoff_s=1.0)
    with pytest.raises(ValueError, match="URL"):
        Fleet("http://127.0.0.1:1", gate="g")


async def test_every_key_carries_the_tag_and_an_expiry(
    fleet: Either, admin: redis.Redis, gate: str
) -> None:
    await fleet.take(UP, [("requests", 1, 10, 0.1), ("tokens", 5, 100, 1.0)])
    await fleet.observe(UP, "tokens", limit=100, rate=1.0, remaining=90, amount=5, seq=1)
    await fleet.hold(UP, 2, 1.0)
    await fleet.hold(UP, 1, 1.0, scope="gpt-4o")
    await fleet.acquire(UP, 4)
    await fleet.heartbeat(UP)
    await fleet.deposit(UP, RetryBudgetPolicy())
    await fleet.report(UP, False, BreakerPolicy(fail_max=1, reset_timeout_s=0.5))
    await fleet.claim_probe(UP)
    await fleet.first(UP, 5.0)
    await fleet.probed(UP, {"tokens": ("tokens", 100.0, 1.0)}, 60.0)
    keys = sorted(k.decode() for k in admin.scan_iter(match=f"yieldgate:{gate}:*"))
    tag = f"yieldgate:{gate}:{{{UP}}}:"
    assert [k.removeprefix(tag) for k in keys] == [
        "breaker",
        "budget",
        "first",
        "holds",
        "leases",
        "members",
        "quota:requests",
        "quota:tokens",
        "scope-holds",
        "seq",
        "shapes",
    ]
    assert len({key_slot(k.encode()) for k in keys}) == 1  # one Redis Cluster slot
    for key in keys:
        assert admin.pttl(key) > 0, key

"""The fleet's first reading of a quota as a resource of the attempts that hold it
(issue 39, defects 1 and 2): an ask or a probe that ends without an answer is handed
on at once, and only an answer that came back settles the reading.

Members are Gates of one process sharing a real Redis; their provider is an
OpenAI-style quota (``Provider``) answering with ``x-ratelimit-*`` headers. Each
member waits for a first reading up to 30 s (``first_reading_s``), so a wait that
was not handed on shows as a call that takes 30 s: the tests bound them well below.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

from tests.fleet.conftest import DelayProxy, RedisServer
from yieldgate import (
    Cost,
    FleetConfigError,
    FleetPolicy,
    Gate,
    GatePolicy,
    RetryPolicy,
    YieldgateError,
)
from yieldgate.dialects import OPENAI
from yieldgate.fleet import Fleet

pytestmark = pytest.mark.anyio

WAIT_S = 30.0  # first_reading_s: what a wait nobody hands on lasts
PROMPT_S = 8.0  # what the calls here are given instead (slow machines included)


class Provider:
    """An OpenAI-style token quota: ``limit`` tokens, full again ``window_s`` after it
    was empty; a request that does not fit gets a 429 (with the headers); every
    answer says what is left."""

    def __init__(self, limit: float = 1000.0, window_s: float = 2.0) -> None:
        self.limit = limit
        self.rate = limit / window_s
        self.level = limit
        self.at = time.monotonic()
        self.lock = threading.Lock()
        self.ok = self.refused = 0

    def answer(self, tokens: float) -> httpx.Response:
        with self.lock:
            now = time.monotonic()
            self.level = min(self.limit, self.level + (now - self.at) * self.rate)
            self.at = now
            fits = tokens <= self.level
            if fits:
                self.level -= tokens
                self.ok += 1
            else:
                self.refused += 1
            reset = (self.limit - self.level) / self.rate
            headers = {
                "x-ratelimit-limit-tokens": str(int(self.limit)),
                "x-ratelimit-remaining-tokens": str(math.floor(self.level)),
                "x-ratelimit-reset-tokens": f"{reset:.3f}s",
            }
        if fits:
            return httpx.Response(200, json={"ok": True}, headers=headers)
        wait = (tokens - self.level) / self.rate
        headers["retry-after-ms"] = str(math.ceil(wait * 1000))
        return httpx.Response(429, json={"error": {"message": "rate limited"}}, headers=headers)


@pytest.fixture
def members(redis_server: RedisServer) -> Iterator[Callable[..., Gate]]:
    """Members of one fleet (``make(url=None, **fleet_policy)``), closed after the test."""
    made: list[Gate] = []
    name = f"first-{time.monotonic_ns()}"

    def make(url: str | None = None, **fleet: Any) -> Gate:
        options = {"budget_s": 1.0, "first_reading_s": WAIT_S, **fleet}
        policy = GatePolicy(fleet=FleetPolicy(**options), retry=RetryPolicy(max_yields=50))
        gate = Gate(policy, name=name, shared=url or redis_server.url)
        made.append(gate)
        return gate

    yield make
    for gate in made:
        gate.close()


async def until(check: Callable[[], bool]) -> None:
    """Until ``check()`` holds (the state of other tasks), within ``PROMPT_S``."""
    with anyio.fail_after(PROMPT_S):
        while not check():  # noqa: ASYNC110 - state the Gate keeps, no event for it
            await anyio.sleep(0.01)


async def burst(gate: Gate, provider: Provider, n: int, tokens: int = 200) -> float:
    """``n`` calls at once through ``gate`` to ``provider``: the seconds they took."""

    async def one() -> None:
        async def send() -> httpx.Response:
            answer = provider.answer(tokens)
            await anyio.sleep(0.05)  # the answer's way back: calls overlap
            return answer

        await gate.call(send, cost=Cost(1, tokens), classify=OPENAI)

    start = time.monotonic()
    with anyio.fail_after(PROMPT_S):
        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)
    return time.monotonic() - start


def clean(*gates: Gate) -> None:
    for gate in gates:
        assert gate._core.audit() == [], gate._core.audit()


async def test_a_probe_cancelled_waiting_for_its_lease_is_handed_on_at_once(
    members: Callable[..., Gate], redis_server: RedisServer
) -> None:
    """Defect 1: the probe cancelled before it was sent (here, waiting for a fleet
    lease) kept the probe: every call of the fleet then waited out the whole
    first_reading_s (on main, b's burst failed this test's 8 s bound: its calls
    waited for a probe whose member had given up on it)."""
    a, b = members(inflight_cap=1), members(inflight_cap=1)
    upstream = a._core.upstreams[0].name
    provider = Provider()
    async with Fleet(redis_server.url, gate=a.name, member="holder", budget_s=1.0) as holder:
        lease = await holder.acquire(upstream, 1)  # the fleet's one lease, taken
        assert isinstance(lease, str)
        shared = a._core.shared
        assert shared is not None
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(burst, a, provider, 1)
                await until(shared.line.waiting)  # the probe waits for the lease
                scope.cancel()
        await holder.release(upstream, lease)
    # The probe never went: the next member's calls go at once, one of them probing.
    assert await burst(b, provider, 10) < PROMPT_S
    assert provider.refused == 0
    clean(a, b)


async def test_a_probe_that_ends_unsent_hands_it_to_a_waiting_call_of_its_member(
    members: Callable[..., Gate], redis_server: RedisServer
) -> None:
    """Defect 1, in one member: its probe's call runs out of time waiting for its
    lease; the member's other calls, waiting for that probe, take it over at once."""
    a = members(inflight_cap=1)
    upstream = a._core.upstreams[0].name
    provider = Provider()
    async with Fleet(redis_server.url, gate=a.name, member="holder", budget_s=1.0) as holder:
        lease = await holder.acquire(upstream, 1)
        assert isinstance(lease, str)

        async def doomed() -> None:
            async def send() -> httpx.Response:
                return provider.answer(10)

            with pytest.raises(Exception, match="total timeout"):
                await a.call(send, cost=Cost(1, 10), classify=OPENAI, timeout=0.5)

        async with anyio.create_task_group() as tg:
            tg.start_soon(doomed)
            await anyio.sleep(0.1)  # the doomed call asked first: it is the probe
            tg.start_soon(burst, a, provider, 5)
            await until(lambda: a.statistics().calls_failed > 0)
            await holder.release(upstream, lease)
    assert provider.ok == 5
    clean(a)


async def test_an_ask_cancelled_before_redis_answers_gives_the_probe_back(
    members: Callable[..., Gate], redis_server: RedisServer
) -> None:
    """Defect 1: a call cancelled while it asks ``first`` (Redis slow to answer). Redis
    made its member the probe; on main nobody gave it back, and the other member
    waited out first_reading_s."""
    with DelayProxy(redis_server.port, 0.5) as proxy:
        a = members(url=proxy.url, budget_s=3.0)
        b = members()
        provider = Provider()
        shared = a._core.shared
        assert shared is not None
        states = shared.first._states
        async with anyio.create_task_group() as tg:
            tg.start_soon(burst, a, provider, 1)
            # Cancelled while its ask is out (Redis's answer takes 0.5 s to come).
            await until(lambda: any(s.asking is not None for s in states.values()))
            tg.cancel_scope.cancel()
        assert await burst(b, provider, 10) < PROMPT_S
    assert provider.refused == 0
    clean(a, b)


@pytest.mark.parametrize("failure", ["503", "connect", "cancelled"])
async def test_only_an_answer_that_came_back_settles_the_first_reading(
    members: Callable[..., Gate], failure: str
) -> None:
    """Defect 2: a probe whose attempt failed (a 503 without rate-limit headers, a
    connection error, cancelled in flight) settled the fleet's first reading as "no
    quota" for 60 s, and the next member's burst went out blind: 3 to 8 429s on
    main, where a probe that came back gives none."""
    a, b = members(), members()
    provider = Provider()
    sent = anyio.Event()

    async def failing() -> httpx.Response:
        if failure == "503":
            return httpx.Response(503, json={"error": "unavailable"})
        if failure == "connect":
            raise httpx.ConnectError("refused")
        sent.set()
        await anyio.sleep_forever()
        raise AssertionError  # pragma: no cover

    if failure == "cancelled":
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: a.call(failing, cost=Cost(1, 10), classify=OPENAI))
            await sent.wait()
            tg.cancel_scope.cancel()
    else:
        # Retried until its time is up: every attempt of it is the probe, and fails.
        with pytest.raises(YieldgateError):
            await a.call(failing, cost=Cost(1, 10), classify=OPENAI, timeout=0.3)
    await burst(b, provider, 10)
    assert provider.refused == 0
    clean(a, b)


async def test_a_member_without_permission_fails_every_call_at_once(
    redis_server: RedisServer, members: Callable[..., Gate]
) -> None:
    """Defect 1: a Redis user that may not run the fleet's scripts: the ask for the
    first reading fails (``FleetConfigError``) and ends the ask phase at once. On
    main the calls after the first waited out first_reading_s before failing."""
    admin = redis_server.client()
    user = f"yg-first-{time.monotonic_ns()}"
    admin.execute_command("ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "&*", "+@all",
                          "-evalsha", "-eval")  # fmt: skip
    try:
        gate = members(url=f"redis://{user}:pw@127.0.0.1:{redis_server.port}/0")
        errors: list[BaseException] = []

        async def one() -> None:
            try:
                await gate.call(anyio.lowlevel.checkpoint)
            except FleetConfigError as exc:
                errors.append(exc)

        start = time.monotonic()
        with anyio.fail_after(PROMPT_S):
            async with anyio.create_task_group() as tg:
                for _ in range(5):
                    tg.start_soon(one)
        assert len(errors) == 5
        assert time.monotonic() - start < PROMPT_S
        clean(gate)
    finally:
        admin.execute_command("ACL", "DELUSER", user)
        admin.close()

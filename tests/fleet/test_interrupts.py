"""Ctrl-C anywhere, in a fleet: nothing stays granted in Redis either.

tests/gate/test_interrupts*.py interrupt the entry points of a Gate alone at
every line; here the Gate is a member of a fleet (a real Redis,
tests/fleet/conftest.py) with an in-flight cap and a quota of its own, so that
the lines between a fleet grant and its entry in a ledger (a fleet lease, a
take from the fleet's buckets: the driver's answer, then admission's step)
and those that move a fleet lease to a held slot are among those interrupted.

The member's clock stands still (a test's), so that each run takes the same
path (no heartbeat or read of the holds falls due in one run and not another);
what a call waits for, it waits for on a signal. After each interrupt: the
member holds nothing (``held`` waits for what its worker thread was handed to
run), Redis holds no lease of its, and its buckets count nothing unseen (a
take neither answered nor refunded); then, the interrupt dropped, the slot is
free and a call gets it at once.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from tests.fleet.conftest import RedisServer
from tests.gate.holdings import held
from tests.gate.interrupts import InterruptAt, answer, own_lock, strides, until
from tests.gate.test_interrupts import Parking, call_and_hold_sync, ctrl_c
from tests.gate.test_interrupts_async import call_and_hold
from yieldgate import FleetPolicy, Gate, GatePolicy, QuotaPolicy, RetryBudgetPolicy, WindowPolicy
from yieldgate.fleet import FirstReading, Fleet
from yieldgate.fleet._records import Take
from yieldgate.gate import NullInstrumentation

pytestmark = pytest.mark.counters_may_drift

Build = Callable[[int], Gate]


@pytest.fixture
def build(
    redis_server: RedisServer, gate: str, admin: redis.Redis
) -> Iterator[Callable[[int], Gate]]:
    """Members of a fleet of their own each (the test's Gate name and the run's
    number), one slot each, two in flight in the fleet, paced by a quota of their
    own taken from the fleet's buckets; on a clock that stands still. Closed after."""
    made: list[Gate] = []

    def make(n: int) -> Gate:
        policy = GatePolicy(
            window=WindowPolicy.fixed(1),
            quota=QuotaPolicy(requests_per_minute=6000),
            fleet=FleetPolicy(inflight_cap=2, lease_ttl_s=60.0, budget_s=2.0, first_reading_s=0),
        )
        member = Gate(
            policy,
            name=f"{gate}-{n}",
            instrumentation=NullInstrumentation(),
            clock=lambda: 1000.0,
            shared=redis_server.url,
        )
        own_lock(member)
        made.append(member)
        return member

    yield make
    for member in made:
        member.close()


def in_redis(admin: redis.Redis, member: Gate) -> list[str]:
    """What Redis still holds for ``member``: its leases, and takes counted unseen."""
    keys = member._core.shared.fleet.keys  # type: ignore[union-attr]
    found = []
    leases = admin.zcard(keys.leases(member.name))
    if leases:
        found.append(f"{leases} lease(s)")
    for key in admin.scan_iter(match=keys.bucket(member.name, "*")):
        unseen = float(admin.hget(key, "unseen") or 0)
        if unseen:
            found.append(f"{key.decode()}: {unseen:g} unseen")
    return found


def check(
    member: Gate,
    admin: redis.Redis,
    tracer: InterruptAt,
    outcome: list[Any],
    received: list[bool],
    where: str,
) -> None:
    """What an interrupted run leaves (see the module docstring); ``outcome`` is emptied."""
    assert len(outcome) == 1, where
    if tracer.fired:
        assert ctrl_c(outcome[0]), f"{where}: {outcome[0]!r}"
    else:
        assert outcome == ["ok"], where
    assert held(member) == [], where
    if tracer.fired and not received:
        assert member.statistics().window.inflight == 0, f"{where}: the caller got nothing"
    outcome.clear()
    if member.statistics().window.inflight:
        gc.collect()
    assert member.statistics().window.inflight == 0, f"{where}: the slot stays taken"
    assert held(member) == [], where
    # The worker runs what the member gave back: Redis has it soon after.
    end = time.monotonic() + 10
    while in_redis(admin, member) and time.monotonic() < end:
        time.sleep(0.005)
    assert in_redis(admin, member) == [], where
    assert member.call_sync(answer, timeout=5) == "ok", where
    member.close()


def run_sync(member: Gate, n: int) -> tuple[InterruptAt, list[Any], list[bool]]:
    """``call_and_hold_sync`` in a thread, interrupted at its ``n``-th line, waiting for
    the only window slot (the fleet has room for both), freed once it is parked."""
    _, lease = member.call_and_hold_sync(answer)
    timer = member._timer = Parking()
    tracer = InterruptAt(member, n)
    outcome: list[Any] = []
    received: list[bool] = []

    def caller() -> None:
        sys.settrace(tracer)
        try:
            outcome.append(call_and_hold_sync(member, received))
        except BaseException as exc:
            outcome.append(exc)
        finally:
            sys.settrace(None)

    thread = threading.Thread(target=caller)
    thread.start()
    until(lambda: timer.parked.is_set() or outcome, "the call waits")
    lease.release()
    thread.join(30)
    assert not thread.is_alive()
    return tracer, outcome, received


def run_async(member: Gate, n: int) -> tuple[InterruptAt, list[Any], list[bool]]:
    """``call_and_hold`` in a task of its own, interrupted at its ``n``-th line, as in
    tests/gate/test_interrupts_async.py."""
    _, lease = member.call_and_hold_sync(answer)
    outcome: list[Any] = []
    received: list[bool] = []
    main: list[Any] = []

    def traced() -> bool:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return False
        return task is not None and task not in main

    tracer = InterruptAt(member, n, only=traced)

    async def run() -> Any:
        main.append(asyncio.current_task())
        target = asyncio.create_task(call_and_hold(member, received))
        while not (member.statistics().window.waiting or target.done()):  # noqa: ASYNC110
            await asyncio.sleep(0)
        lease.release()
        return await target

    sys.settrace(tracer)
    try:
        outcome.append(asyncio.run(run()))
    except BaseException as exc:
        outcome.append(exc)
    finally:
        sys.settrace(None)
        lease.release()
        main.clear()
    return tracer, outcome, received


def sweep(build: Build, admin: redis.Redis, run: Callable[..., Any], every: int = 1) -> int:
    for n in (-1, 0):  # the first warms what is made once
        member = build(n)
        counted, outcome, received = run(member, 0)
        check(member, admin, counted, outcome, received, "not interrupted")
    lines = counted.lines
    for n in strides(lines, every):
        member = build(n)
        tracer, outcome, received = run(member, n)
        assert tracer.fired, f"line {n} of {lines} never reached"
        check(member, admin, tracer, outcome, received, f"interrupted at line {n} of {lines}")
    return lines


def test_call_and_hold_sync_in_a_fleet_survives_an_interrupt_at_any_line(
    build: Build, admin: redis.Redis
) -> None:
    assert sweep(build, admin, run_sync) > 100


def test_call_and_hold_in_a_fleet_survives_an_interrupt_at_any_line(
    build: Build, admin: redis.Redis
) -> None:
    assert sweep(build, admin, run_async, every=2) > 100


def test_every_grant_of_the_fleet_has_its_give_back() -> None:
    """What the fleet grants (each operation ``Fleet`` can undo) is given back by the
    call that received it, if an interrupt came before its entry in a ledger."""
    from yieldgate.gate._shared import GRANTS, FleetOp, given_back

    policy = RetryBudgetPolicy()
    take = FleetOp("take", ("up", [("up:requests", 1.0, 100.0, 1.0)]))
    first = FleetOp("first", ("up", 5.0))
    cases = [
        (FleetOp("acquire", ("up", 2)), "lease-1", FleetOp("release", ("up", "lease-1"))),
        (FleetOp("acquire", ("up", 2)), False, None),
        (take, Take(True, 7, 0.0), FleetOp("refund", ("up", [("up:requests", 1.0)]))),
        (take, Take(False, 0, 1.5), None),
        (FleetOp("withdraw", ("g", policy)), 3, FleetOp("refund_retry", ("g", policy, 3))),
        (FleetOp("withdraw", ("g", policy)), False, None),
        (FleetOp("claim_probe", ("up", 1.0)), True, FleetOp("release_probe", ("up",))),
        (FleetOp("claim_probe", ("up", 1.0)), False, None),
        (first, FirstReading("mine", {}), FleetOp("abandon_first", ("up",))),
        (first, FirstReading("other", {}), None),
    ]
    for op, got, back in cases:
        assert given_back(op, got) == back, (op, got)
        assert given_back(op, None) is None  # Redis did not answer: nothing granted
        assert back is None or callable(getattr(Fleet, back.name + "_sync"))
    assert {op.name for op, _, _ in cases} == GRANTS


def test_a_call_interrupted_as_it_waits_for_the_first_reading_leaves_no_waiter(
    redis_server: RedisServer, gate: str
) -> None:
    """Regression (the fleet machine, tests/fleet/test_fleet_machine.py): a call
    waiting for another member's probe entered its wake-up among the member's
    waiters under the lock, and the ``finally`` that takes it out began two lines
    later: Ctrl-C between them left it there for ever (``audit``: "1 call(s) wait
    for the first reading"), and every move of the reading woke a call long gone.
    Each run interrupts ``call_sync`` at its ``n``-th line, on a new member."""
    policy = GatePolicy(fleet=FleetPolicy(budget_s=2.0, first_reading_s=30.0))
    holder = Fleet(redis_server.url, gate=gate, member="holder", budget_s=2.0)
    try:
        n = 0
        while True:
            n += 1
            member = Gate(
                policy, name=gate, shared=redis_server.url, instrumentation=NullInstrumentation()
            )
            if n == 1:  # another member probes the first reading, for the whole test
                first = holder.first_sync(member._core.upstreams[0].name, 30.0)
                assert first is not None
                assert first.state == "mine"
            own_lock(member)
            tracer = InterruptAt(member, n)
            sys.settrace(tracer)
            try:
                member.call_sync(answer, timeout=0.15)  # waits 0.05 s, then goes
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)
            left = [p for p in held(member) if "first reading" in p]
            assert left == [], f"interrupted at line {n}"
            member.close()
            if not tracer.fired:
                break
        assert n > 50, n
    finally:
        holder.close()

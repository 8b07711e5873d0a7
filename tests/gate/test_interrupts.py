"""Ctrl-C anywhere: a ``KeyboardInterrupt`` at any line of the Gate's code strands nothing.

Each sync entry point (``call_sync``, ``call_and_hold_sync``, ``hold_sync``,
``gate.wrap`` on a plain function, ``map_sync``, the sync HTTP transport: a
request, its body read, the response closed) is interrupted at the n-th line
of the Gate's code it runs (tests/gate/interrupts.py), for every n it reaches.
The call waits for a window slot that another thread frees, and paces by a
quota, so the lines between a grant and its use (issue 28: "a KeyboardInterrupt
landing between a grant and its try leaks the permit"), and those between a
held slot's grant and its hand-over to the caller (issue 39: ``handed = True``
set before the ``Lease`` existed), are among them. The async entry points are
in test_interrupts_async.py, those of a fleet in tests/fleet/test_interrupts.py.

After each interrupt, while the ``KeyboardInterrupt`` is still referenced (a
REPL keeps the last traceback, and with it every frame's locals): the Gate
holds nothing that no ``Lease`` accounts for (``GateCore.audit``, which also
reports a held slot whose ``Lease`` is gone or never was), and an interrupt
before the caller got what the entry point hands out left no slot taken. Then,
the interrupt dropped (and with it any ``Lease`` the caller had, whose
finalizer gives its slot back): nothing is held, and a call gets the slot at
once. What is checked is what the Gate holds (the counters in
``statistics()`` may miss the end of a call interrupted between counting it
and ending it).
"""

from __future__ import annotations

import _thread
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx2
import pytest

from tests.gate.holdings import held
from tests.gate.interrupts import InterruptAt, answer, own_lock, strides, until
from yieldgate import (
    Gate,
    GatePolicy,
    Outcome,
    Priority,
    QuotaPolicy,
    WindowPolicy,
    current_attempt,
    http_client,
)
from yieldgate.gate import Lease, NullInstrumentation
from yieldgate.gate._core import Held
from yieldgate.gate._cost import QuotaReading
from yieldgate.gate._sync import Timer

pytestmark = pytest.mark.counters_may_drift

URL = "http://upstream.test/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
Entry = Callable[[Gate, list[bool]], Any]


def read_quota() -> str:
    attempt = current_attempt()
    assert attempt is not None
    attempt.report_quota((QuotaReading("x:requests", "requests", 1000, 999, 60.0),))
    return "ok"


def build(n: int, *, quota: bool) -> Gate:
    """A Gate of one slot, its lock one that knows its owner; with ``quota``, paced by a
    quota learnt from a reading too (so that a call's claim goes in flight)."""
    policy = GatePolicy(
        window=WindowPolicy.fixed(1),
        quota=QuotaPolicy(requests_per_minute=6000) if quota else QuotaPolicy(learn=False),
    )
    gate = Gate(
        policy, name=f"ctrl-c-{n}", instrumentation=NullInstrumentation(), clock=time.monotonic
    )
    own_lock(gate)
    if quota:
        gate.call_sync(read_quota)
    return gate


def chunks() -> Iterator[bytes]:
    yield b'{"choices": '
    yield b"[]}"


def stream(request: httpx2.Request) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "application/json"}, content=chunks())


# -- the entry points, as a caller uses them (``received``: the caller has what it hands out)


def call_sync(gate: Gate, received: list[bool]) -> Any:
    return gate.call_sync(answer, timeout=30)


def call_and_hold_sync(gate: Gate, received: list[bool]) -> Any:
    value, lease = gate.call_and_hold_sync(answer, timeout=30)
    received.append(True)
    lease.release()
    return value


def hold_sync(gate: Gate, received: list[bool]) -> Any:
    with gate.hold_sync(answer, timeout=30) as value:
        received.append(True)
    return value


def wrap(gate: Gate, received: list[bool]) -> Any:
    return gate.wrap(answer, timeout=30)()


def http_sync(gate: Gate, received: list[bool]) -> Any:
    with http_client(gate, sync=True, inner=httpx2.MockTransport(stream)) as client:
        response = client.send(client.build_request("POST", URL, json=BODY), stream=True)
        received.append(True)
        try:
            body = response.read()
        finally:
            response.close()
    assert body == b'{"choices": []}'
    return "ok"


class Parking(Timer):
    """The sync driver's waits, telling when the first begins: the slot is freed only
    once the call is parked, so that every run takes the same path."""

    def __init__(self) -> None:
        self.parked = threading.Event()

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        self.parked.set()
        return event.wait(seconds)


def interrupted(
    gate: Gate, n: int, entry: Entry, *, free: bool = False
) -> tuple[InterruptAt, list[Any], list[bool]]:
    """``entry`` run in a thread, interrupted at its ``n``-th line of watched code; its
    call waits for the only slot (held by this thread, released once the call waits),
    or with ``free`` finds it free."""
    lease = None if free else gate.call_and_hold_sync(answer)[1]
    timer = Parking()
    if not free:
        gate._timer = timer
    tracer = InterruptAt(gate, n)
    outcome: list[Any] = []
    received: list[bool] = []

    def caller() -> None:
        sys.settrace(tracer)
        try:
            outcome.append(entry(gate, received))
        except BaseException as exc:  # the interrupt, raised to the caller
            outcome.append(exc)
        finally:
            sys.settrace(None)
            # No attempt stays current in the caller's context (in a REPL, the next
            # call would take itself for part of it and skip the window).
            if current_attempt() is not None:
                outcome.append(f"left current: {current_attempt()!r}")

    thread = threading.Thread(target=caller)
    thread.start()
    if lease is not None:
        until(lambda: timer.parked.is_set() or outcome, "the call waits")
        lease.release()
    thread.join(30)
    assert not thread.is_alive()
    return tracer, outcome, received


def ctrl_c(raised: object) -> bool:
    """Whether ``raised`` is the interrupt: itself, or (out of a task group's body, as
    ``Gate.map`` has) a group of it alone."""
    if isinstance(raised, BaseExceptionGroup):
        rest = raised.split(KeyboardInterrupt)[1]
        return rest is None
    return isinstance(raised, KeyboardInterrupt)


def check(
    gate: Gate, tracer: InterruptAt, outcome: list[Any], received: list[bool], where: str
) -> None:
    """What an interrupted run leaves (see the module docstring); ``outcome`` is emptied."""
    assert len(outcome) == 1, where
    if tracer.fired:
        assert ctrl_c(outcome[0]), f"{where}: {outcome[0]!r}"
    else:
        assert outcome == ["ok"], where
    # The interrupt still referenced, with the frames it went through.
    assert held(gate) == [], where
    if tracer.fired and not received:
        assert gate.statistics().window.inflight == 0, f"{where}: the caller got nothing"
    outcome.clear()
    if gate.statistics().window.inflight:
        gc.collect()  # a Lease the caller had, in a frame of a cycle: its finalizer
    assert gate.statistics().window.inflight == 0, f"{where}: the slot stays taken"
    assert held(gate) == [], where
    # And the Gate goes on: a call after the interrupt gets the slot at once.
    assert gate.call_sync(answer, timeout=5) == "ok", where


def sweep(entry: Entry, *, quota: bool = False, every: int = 1) -> int:
    """Interrupt ``entry`` at each of its lines (or ``every`` so many); how many it has."""
    for _ in range(2):  # the first builds what is built once (a transport's class)
        gate = build(0, quota=quota)
        counted, outcome, received = interrupted(gate, 0, entry)
        check(gate, counted, outcome, received, "not interrupted")
    lines = counted.lines
    for n in strides(lines, every):
        gate = build(n, quota=quota)
        tracer, outcome, received = interrupted(gate, n, entry)
        assert tracer.fired, f"line {n} of {lines} never reached"
        check(gate, tracer, outcome, received, f"interrupted at line {n} of {lines}")
    return lines


@pytest.mark.parametrize("quota", [False, True], ids=["plain", "quota"])
def test_call_sync_survives_an_interrupt_at_any_line(quota: bool) -> None:
    assert sweep(call_sync, quota=quota) > 50  # admission, the attempt, its end


def express(gate: Gate, received: list[bool]) -> Any:
    return gate.call_sync(answer)  # the policy's timeout, no cost: the express lane


def retried(gate: Gate, received: list[bool]) -> Any:
    """A first answer that is not a plain success: the express lane hands its attempt
    to a call, which retries (the backoff slept at once)."""
    answers = iter([Outcome.retryable(TimeoutError("slow")), "ok"])
    gate._timer = Instant()
    return gate.call_sync(lambda: next(answers))


class Instant(Timer):
    def sleep(self, seconds: float) -> None:
        pass


@pytest.mark.parametrize("entry", [express, retried])
def test_the_express_lane_survives_an_interrupt_at_any_line(entry: Entry) -> None:
    """A call of the plain shape with its slot free goes by the express lane (its first
    attempt made and ended without a ``CallState``); one whose answer is not a plain
    success is handed to a call midway. An interrupt at any of their lines strands
    nothing, and the calls that ended are all counted."""
    counted = None
    for _ in range(2):
        gate = build(0, quota=False)
        counted, outcome, _ = interrupted(gate, 0, entry, free=True)
        check(gate, counted, outcome, [], "not interrupted")
    assert counted is not None
    for n in range(1, counted.lines + 1):
        gate = build(n, quota=False)
        tracer, outcome, received = interrupted(gate, n, entry, free=True)
        assert tracer.fired, f"line {n} of {counted.lines} never reached"
        check(gate, tracer, outcome, received, f"interrupted at line {n} of {counted.lines}")
        stats = gate.statistics()
        assert stats.calls_ok + stats.calls_failed <= stats.calls


@pytest.mark.parametrize("quota", [False, True], ids=["plain", "quota"])
def test_call_and_hold_sync_survives_an_interrupt_at_any_line(quota: bool) -> None:
    """Issue 39, defect 7: the path every sync HTTP request takes. On the old Gate,
    an interrupt at 22 of its lines left the slot taken for ever, by a ``Held``
    that no ``Lease`` owned (and that ``audit`` counted as accounted for)."""
    assert sweep(call_and_hold_sync, quota=quota) > 50


def test_hold_sync_survives_an_interrupt_at_any_line() -> None:
    assert sweep(hold_sync) > 50


def test_a_wrapped_function_survives_an_interrupt_at_any_line() -> None:
    assert sweep(wrap) > 50


def test_the_sync_http_transport_survives_an_interrupt_at_any_line() -> None:
    """A request, its body read and the response closed, through ``http_client(sync=True)``."""
    assert sweep(http_sync) > 100


# -- map_sync: Ctrl-C reaches the caller's thread while its workers run calls ----------------


def interrupted_map(n: int) -> tuple[Gate, InterruptAt, list[Any]]:
    """``map_sync`` over three items, one worker; when the worker reaches its ``n``-th
    line of Gate code, the caller's thread is interrupted as Ctrl-C would (the worker
    waits there until the caller has raised). What the caller got is returned."""
    gate = build(n, quota=False)
    tracer = InterruptAt(gate, n)
    fired = tracer.local
    stopped = threading.Event()

    def local(frame: Any, event: str, arg: Any) -> Any:
        try:
            return fired(frame, event, arg)
        except KeyboardInterrupt:  # not here: in the caller's thread, as a signal lands
            _thread.interrupt_main()
            stopped.wait(10)
            return tracer.local

    tracer.local = local  # type: ignore[method-assign]
    outcome: list[Any] = []
    threading.settrace(tracer)
    try:
        outcome.append(gate.map_sync(lambda item: item, [1, 2, 3], concurrency=1, timeout=30))
    except KeyboardInterrupt as exc:
        outcome.append(exc)
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
        stopped.set()
    for worker in [t for t in threading.enumerate() if t.name == f"{gate.name}-map"]:
        worker.join(30)
        assert not worker.is_alive()
    return gate, tracer, outcome


def test_map_sync_survives_an_interrupt_while_its_worker_is_at_any_line() -> None:
    """``map_sync`` stops its batch on Ctrl-C and raises at once; the worker's call, at
    whatever line it was, ends in its thread (a wait it was in ends with the batch)."""
    gate, counted, outcome = interrupted_map(0)
    assert outcome == [[1, 2, 3]]
    assert held(gate) == []
    lines = counted.lines
    assert lines > 50
    for n in strides(lines):
        gate, tracer, outcome = interrupted_map(n)
        where = f"worker at line {n} of {lines}"
        assert tracer.fired, where
        assert len(outcome) == 1, where
        assert isinstance(outcome[0], KeyboardInterrupt), where
        assert held(gate) == [], where
        assert gate.statistics().window.inflight == 0, where
        assert gate.call_sync(answer, timeout=5) == "ok", where


def test_audit_sees_a_held_slot_that_no_lease_owns() -> None:
    """Issue 39, defect 7: ``audit`` counted every ``Held`` as accounted for, so the
    slot an interrupt stranded between a ``Held`` and its ``Lease`` went unseen. A held
    slot with no ``Lease``, or whose ``Lease`` is gone, is reported."""
    gate = build(0, quota=False)
    core = gate._core
    up = core.upstreams[0]
    with core.lock:
        slot = Held(core, up, up.window.try_acquire(Priority.NORMAL), None)
        core.held.add(slot)
    assert core.audit() == ["ctrl-c-0/ctrl-c-0: 1 held slot(s) with no Lease to give them back"]
    lease = Lease(slot)  # an owner: its finalizer gives the slot back
    assert core.audit() == []
    del lease
    assert core.audit() == []
    assert gate.statistics().window.inflight == 0

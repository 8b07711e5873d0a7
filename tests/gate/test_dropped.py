"""Held bodies dropped in a reference cycle, found by a waiting caller's collection (``_dropped``).

The Gate's side of issue 39's defect 8, without a server (tests/e2e/test_abandoned_streams.py
has the official clients' streams): a lease with an idle bound, as a transport's response body
holds, dropped inside a reference cycle, comes back as soon as a caller has waited a moment
for its slot, not when it lapses; the collections are budgeted; a lease released inside a
collection never waits for the Gate's lock. Times are virtual; the collections are real.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.gate.holdings import held
from tests.gate.test_drivers import VirtualTimer
from yieldgate import DeadlineExceededError, Gate, GatePolicy, WindowPolicy
from yieldgate.gate import Lease, NullInstrumentation, _dropped
from yieldgate.gate._window import Window
from yieldgate.protocol import Priority

IDLE_BOUND_S = 60.0  # a body's: the attempt's time


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> _dropped.Collector:
    """A process that made no collection for waiters lately."""
    fresh = _dropped.Collector()
    monkeypatch.setattr(_dropped, "COLLECTOR", fresh)
    return fresh


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    """The collector stays on, but never starts on its own during the test."""
    before = gc.get_threshold()
    gc.set_threshold(10**9, 10**9, 10**9)
    try:
        yield
    finally:
        gc.set_threshold(*before)


class Cycle:
    """What keeps a dropped stream alive: an object that refers to itself (openai's
    ``Stream`` through the generator that reads it), and to the body's lease."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.me = self


def sync_gate(window: int = 1) -> tuple[Gate, VirtualTimer]:
    timer = VirtualTimer()
    g = Gate(
        GatePolicy(window=WindowPolicy.fixed(window)),
        instrumentation=NullInstrumentation(),
        clock=timer.now,
    )
    g._timer = timer
    return g, timer


def drop_a_body(g: Gate, *, promoted: bool) -> None:
    """A held slot with a body's idle bound, left in a cycle (after a collection that
    promoted it to the oldest generation, when ``promoted``)."""
    _, lease = g.call_and_hold_sync(lambda: "streaming")
    lease.lapse_after(IDLE_BOUND_S)
    cycle = Cycle(lease)
    del lease
    if promoted:
        gc.collect()
    del cycle


def test_a_body_dropped_in_a_cycle_comes_back_once_a_caller_waited_a_moment(
    collector: _dropped.Collector,
) -> None:
    g, timer = sync_gate()
    drop_a_body(g, promoted=True)
    # On main: the slot came back only when it lapsed (60 s), past this call's 5 s.
    assert g.call_sync(lambda: "next", timeout=5) == "next"
    assert timer.t == pytest.approx(_dropped.IDLE_S)
    assert collector.runs == {1: 1, 2: 1}, "young first, then the whole heap"
    assert held(g) == []


def test_a_young_cycle_takes_no_whole_heap_collection(
    collector: _dropped.Collector, no_automatic_collection: None
) -> None:
    g, timer = sync_gate()
    drop_a_body(g, promoted=False)
    assert g.call_sync(lambda: "next", timeout=5) == "next"
    assert timer.t == pytest.approx(_dropped.IDLE_S)
    assert collector.runs == {1: 1, 2: 0}
    assert held(g) == []


@pytest.mark.anyio
async def test_an_async_waiter_finds_it_too(collector: _dropped.Collector) -> None:
    g = Gate(GatePolicy(window=WindowPolicy.fixed(1)), instrumentation=NullInstrumentation())
    _, lease = await g.call_and_hold(_value)
    lease.lapse_after(IDLE_BOUND_S)
    cycle = Cycle(lease)
    del lease
    gc.collect()
    del cycle
    assert await g.call(_value, timeout=5) == "value"
    assert collector.runs[2] == 1
    assert held(g) == []


async def _value() -> str:
    return "value"


def test_a_body_still_referenced_keeps_its_slot(collector: _dropped.Collector) -> None:
    """A slow reader's body is idle, and the waiter collects: the slot stays."""
    g, _ = sync_gate()
    _, lease = g.call_and_hold_sync(lambda: "streaming")
    lease.lapse_after(IDLE_BOUND_S)
    cycle = Cycle(lease)
    with pytest.raises(DeadlineExceededError):
        g.call_sync(lambda: "next", timeout=5)
    assert collector.runs[2] >= 1
    assert not lease.released
    assert cycle.lease is lease
    lease.release()
    assert held(g) == []


def test_a_caller_waiting_briefly_collects_nothing(collector: _dropped.Collector) -> None:
    g, _ = sync_gate()
    _, lease = g.call_and_hold_sync(lambda: "streaming")
    lease.lapse_after(IDLE_BOUND_S)
    g._timer.wait = _release_after(lease, g._timer.wait)  # type: ignore[method-assign]
    assert g.call_sync(lambda: "next", timeout=5) == "next"
    assert collector.runs == {1: 0, 2: 0}
    assert held(g) == []


def _release_after(lease: Lease, wait: Any) -> Any:
    """The timer's ``wait``, except that the first one ends with the lease released
    after 0.05 s (a stream read to its end meanwhile)."""

    def first(event: threading.Event, seconds: float | None) -> bool:
        if not lease.released:
            lease.release()
            return wait(event, min(seconds or 0.05, 0.05))
        return bool(wait(event, seconds))

    return first


def test_nothing_is_collected_for_a_process_that_turned_the_collector_off(
    collector: _dropped.Collector,
) -> None:
    g, _ = sync_gate()
    _, lease = g.call_and_hold_sync(lambda: "streaming")
    lease.lapse_after(1.0)
    gc.disable()
    try:
        assert g.call_sync(lambda: "next", timeout=5) == "next"  # once it lapsed
    finally:
        gc.enable()
    assert collector.runs == {1: 0, 2: 0}
    assert lease.released
    assert held(g) == []


# -- a lease released inside a collection -------------------------------------------------------


class ReleasedWhenCollected:
    """As a dropped stream's generator, which closes its response when it is collected."""

    def __init__(self, lease: Lease) -> None:
        self.lease = lease
        self.me = self

    def __del__(self) -> None:
        self.lease.release()


def test_a_lease_released_by_a_collection_inside_the_gates_lock_does_not_deadlock() -> None:
    """An automatic collection may start at any allocation, in the Gate's critical sections
    too; a finalizer that releases a lease then must not wait for the lock (on main it did,
    for ever: ``Lease.release`` took the lock its own thread held)."""
    g, _ = sync_gate()
    _, lease = g.call_and_hold_sync(lambda: "streaming")
    ReleasedWhenCollected(lease)
    del lease
    lock = g._core.lock
    done = threading.Event()

    def collect_under_the_lock() -> None:
        with lock:
            assert not _dropped.in_collection()
            gc.collect()
        done.set()

    thread = threading.Thread(target=collect_under_the_lock, daemon=True)
    thread.start()
    if not done.wait(10):
        lock.release()  # let the stuck thread go, so that the checks after the test can run
        thread.join(10)
        pytest.fail("deadlocked: a lease released inside a collection waited for the lock")
    thread.join(10)
    # Left to the next caller that looks: it takes the slot at once.
    assert g.call_sync(lambda: "next", timeout=5) == "next"
    assert held(g) == []


def test_in_collection_is_true_only_on_the_collecting_thread_during_a_collection() -> None:
    _dropped.watch_collections()  # as the first ``Lease`` that holds a slot does
    seen: list[bool] = []

    class Looks:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            seen.append(_dropped.in_collection())

    Looks()
    assert not _dropped.in_collection()
    gc.collect()
    assert seen == [True]
    assert not _dropped.in_collection()


# -- the budget ---------------------------------------------------------------------------------


class FakeHeap:
    """``gc.collect`` on a clock: each kind takes a set time, and is recorded."""

    def __init__(self, young_s: float, full_s: float) -> None:
        self.t = 0.0
        self.took = {1: young_s, 2: full_s}
        self.kinds: list[int] = []

    def now(self) -> float:
        return self.t

    def collect(self, kind: int) -> int:
        self.kinds.append(kind)
        self.t += self.took[kind]
        return 0


def test_a_collection_waits_until_the_last_of_its_kind_is_its_share_of_the_time() -> None:
    heap = FakeHeap(young_s=0.001, full_s=0.05)
    collector = _dropped.Collector(0.05, timer=heap.now, collect=heap.collect)
    assert collector.run(lambda: True) == 0.0  # the young one gave back; a whole-heap one may run
    assert heap.kinds == [1]
    collector.run(lambda: False)  # 1 ms / 5% is 20 ms: the young one waits for the floor
    assert heap.kinds == [1, 2]
    ended = heap.t
    heap.t = ended + _dropped.IDLE_S
    collector.run(lambda: False)
    assert heap.kinds == [1, 2, 1]
    # 50 ms at 5%: nothing whole-heap before 1 s after it ended.
    heap.t = ended + 0.99
    assert collector.run(lambda: False) == pytest.approx(0.009)  # after a young one of 1 ms
    assert heap.kinds == [1, 2, 1, 1]
    heap.t = ended + 1.0
    collector.run(lambda: False)
    assert heap.kinds[-1] == 2
    assert collector.spent_s == pytest.approx(3 * 0.001 + 2 * 0.05)


def test_whole_heap_collections_that_find_nothing_space_out_up_to_the_backoff() -> None:
    heap = FakeHeap(young_s=0.0, full_s=0.1)
    collector = _dropped.Collector(0.05, timer=heap.now, collect=heap.collect)
    gaps = []
    last = None
    for _ in range(600):
        before = collector.runs[2]
        collector.run(lambda: False)
        if collector.runs[2] > before:
            if last is not None:
                gaps.append(round(heap.t - last, 6))
            last = heap.t
        heap.t += 0.1
    # 0.1 s at 5%: 2 s, then doubling while nothing is found, up to 8 times that.
    assert gaps[:5] == pytest.approx([2.1, 4.1, 8.1, 16.1, 16.1], abs=0.11)
    assert collector.spent_s / heap.t < _dropped.SHARE


def test_one_collection_at_a_time_in_the_process() -> None:
    heap = FakeHeap(young_s=0.0, full_s=0.0)
    collector = _dropped.Collector(timer=heap.now, collect=heap.collect)
    inner: list[float] = []

    def gave_back() -> bool:
        inner.append(collector.run(lambda: True))  # another thread, as it collects
        return True

    collector.run(gave_back)
    assert heap.kinds == [1]
    assert inner == [_dropped.IDLE_S]


# -- who looks ----------------------------------------------------------------------------------


def test_the_new_head_of_a_queue_is_woken_to_take_on_the_look() -> None:
    window = Window(WindowPolicy.fixed(1))
    permit = window.try_acquire()
    assert permit is not None
    woken: list[str] = []
    first = window.enqueue(Priority.NORMAL, lambda: woken.append("first"))
    second = window.enqueue(Priority.NORMAL, lambda: woken.append("second"))
    assert window.is_head(first)
    assert not window.is_head(second)
    window.head_looks = True
    window.abandon(first)
    assert woken == ["second"]
    assert window.is_head(second)
    window.abandon(second)
    window.head_looks = False
    window.give_back(permit)


def test_a_process_that_never_holds_a_slot_pays_nothing_per_collection() -> None:
    """The collector's callback, which tells ``in_collection``, is added with the first
    ``Lease`` that holds a slot, not at import."""
    script = (
        "import gc, yieldgate\n"
        "from yieldgate.gate._dropped import _on_collection as watch\n"
        "g = yieldgate.Gate()\n"
        "g.call_sync(lambda: 1)\n"
        "assert watch not in gc.callbacks, 'added at import'\n"
        "_, lease = g.call_and_hold_sync(lambda: 1)\n"
        "assert watch in gc.callbacks, 'not added with a lease'\n"
        "lease.release()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()

"""Ctrl-C at a chosen line: ``KeyboardInterrupt`` raised where a test says, as a signal would.

A signal handler's exception lands between any two lines of Python. ``InterruptAt``
is a trace function that raises ``KeyboardInterrupt`` at the n-th line of watched
code (the Gate's, and its transports' and dialects') run by the traced thread, or
on an event loop by the traced tasks, so that a test can interrupt an entry point
at every line it reaches (tests/gate/test_interrupts*.py, tests/fleet/test_interrupts.py).

Lines run while the traced thread itself holds the Gate's lock are skipped: there
the Gate changes several fields in a row, as any Python code does, and no code can
be interrupted halfway through such an update and stay consistent. The Gate's lock
is swapped for one that knows its owner (``own_lock``), so that the count does not
depend on what other threads (a fleet's worker) do meanwhile. (A real signal's
handler runs on the main thread; the trace runs on the caller's thread or task:
the same interruption, made to land where chosen.)
"""

from __future__ import annotations

import asyncio
import dis
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from yieldgate import Gate
from yieldgate.gate import _dropped

__all__ = ["WATCHED", "InterruptAt", "answer", "own_lock", "strides", "until"]

_PACKAGE = Path(sys.modules["yieldgate"].__file__ or "").parent
# The Gate's code, its HTTP transports' and its dialects' (classifiers the transports use).
WATCHED = tuple(str(_PACKAGE / part) for part in ("gate", "transports", "dialects"))


def answer() -> str:
    return "ok"


class OwnedLock:
    """A ``threading.Lock`` that knows which thread holds it (``owner``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: int | None = None

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = self._lock.acquire(blocking, timeout)
        if got:
            self.owner = threading.get_ident()
        return got

    def release(self) -> None:
        self.owner = None
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def own_lock(gate: Gate) -> OwnedLock:
    """Give ``gate`` a lock that knows its owner (before any call runs on it)."""
    lock = OwnedLock()
    gate._core.lock = lock  # type: ignore[assignment]
    return lock


class InterruptAt:
    """A trace function that raises ``KeyboardInterrupt`` at the ``n``-th line of
    watched code run while the tracing thread does not hold the Gate's lock
    (``n = 0``: never, only count them). ``only``: a test of which frames count
    (on an event loop: the tasks to interrupt)."""

    def __init__(
        self,
        gate: Gate,
        n: int,
        *,
        code: tuple[str, ...] = WATCHED,
        only: Callable[[], bool] | None = None,
    ) -> None:
        lock = gate._core.lock
        assert isinstance(lock, OwnedLock), "own_lock(gate) first"
        self.lock = lock
        self.n = n
        self.code = code
        self.only = only
        self.lines = 0
        self.fired = False

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Any:
        if self.fired or not frame.f_code.co_filename.startswith(self.code):
            return None  # no line events in other code
        if self.only is not None and not self.only():
            return None
        if _finalizing(frame):
            return None
        return self.local

    def local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "line" or self.fired or self.lock.owner == threading.get_ident():
            return self.local
        if frame.f_lasti in _with_exits(frame.f_code):
            return self.local
        self.lines += 1
        if self.lines == self.n:
            self.fired = True
            raise KeyboardInterrupt
        return self.local


_EXITS: dict[CodeType, frozenset[int]] = {}


def _with_exits(code: CodeType) -> frozenset[int]:
    """Where ``code`` leaves a ``with`` block normally, its ``__exit__`` not called yet.

    The line of the ``with`` statement is traced again there, before the call; a
    trace function raising then would skip ``__exit__`` (outside the block's
    handler), which no signal can do: a signal's handler runs at a call's start or
    end, so one that lands there runs once a C ``__exit__`` (a lock's) has returned,
    or inside a Python one. So no interrupt lands at these lines."""
    found = _EXITS.get(code)
    if found is None:
        ops = list(dis.get_instructions(code))
        found = _EXITS[code] = frozenset(
            ops[i].offset
            for i in range(len(ops) - 3)
            if all(op.opname == "LOAD_CONST" and op.argval is None for op in ops[i : i + 3])
            and ops[i + 3].opname in ("PRECALL", "CALL")
            and ops[i + 3].arg == 2
        )
    return found


def _finalizing(frame: FrameType | None) -> bool:
    """Whether ``frame`` runs in a finalizer (a dropped ``Lease``'s, ``GateCore.orphan``)
    or a garbage collection's callback (``_dropped``'s): what a signal's handler raises
    there is not raised to anyone (Python reports it as unraisable and drops it), so an
    interrupt cannot land there. Any code a collection runs is such a finalizer: a
    coroutine of an earlier run, left in a garbage cycle and closed by a collection in
    this one (the Gate's own, for a waiting caller), runs its ``finally`` blocks
    there (seen on 3.13: its lines counted, the interrupt raised in it and dropped)."""
    if _dropped.in_collection():
        return True
    for _ in range(4):
        if frame is None:
            return False
        if frame.f_code.co_filename == weakref.__file__ or frame.f_code in _GC_CALLBACKS:
            return True
        frame = frame.f_back
    return False


# The Gate's garbage-collection callbacks (run by the interpreter, like a finalizer).
_GC_CALLBACKS = frozenset({_dropped._on_collection.__code__})
_dropped.watch_collections()  # so that ``in_collection`` tells, from the first run


def in_tasks(tasks: set[asyncio.Task[Any]]) -> Callable[[], bool]:
    """``InterruptAt``'s ``only`` for the tasks of ``tasks`` (and code outside any)."""

    def check() -> bool:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no loop running
            return False
        return task in tasks

    return check


def strides(lines: int, every: int = 1) -> range:
    """The lines a sweep interrupts: every one, or (``every``) a deterministic stride
    that still starts at the first line and covers each part of the path."""
    return range(1, lines + 1, every)


def until(check: Callable[[], Any], what: str, timeout: float = 10.0) -> None:
    """Poll ``check`` (real time, 1 ms apart) until it holds; fail after ``timeout``."""
    end = time.monotonic() + timeout
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.001)

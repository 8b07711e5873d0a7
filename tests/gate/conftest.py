"""Gate tests run on virtual time, on asyncio and on trio: no test here sleeps for real.

asyncio runs on ``VirtualTimeLoop`` (tests/vtime.py); trio on its own
``MockClock`` with ``autojump_threshold=0``, which jumps to the next deadline
whenever every task is blocked. The Gate, the window, the breaker and the rate
cap are the same code under both.

Every test here ends with the ledger's invariant checked on each Gate it
built: once the test is over, none holds anything that no live lease
accounts for (``GateCore.audit``, tests/gate/holdings.py).
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from trio.testing import MockClock

from tests.gate.holdings import core_held
from tests.vtime import VirtualTimeLoop, gates_read_the_loop_clock
from yieldgate.gate._core import _CORES


@pytest.fixture(
    params=[
        pytest.param("asyncio", id="asyncio"),
        pytest.param("trio", id="trio"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    if request.param == "trio":
        return ("trio", {"clock": MockClock(autojump_threshold=0)})
    return ("asyncio", {"loop_factory": VirtualTimeLoop})


@pytest.fixture(autouse=True)
def _loop_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    gates_read_the_loop_clock(monkeypatch)


@pytest.fixture(autouse=True)
def _nothing_held_after_the_test(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each Gate the test built holds nothing once it is over (its leases collected),
    and every call it counted has ended.

    ``_CORES`` holds the cores weakly, and most tests drop their Gate when they
    return: the cores built during the test are kept here (``_CORES.add``
    recorded) until they are looked at. A test that builds thousands (the
    ledger machine) has those nothing else refers to any more looked at as it
    goes: no call can run on a core nobody holds.
    """
    built: list[Any] = []
    problems: list[str] = []
    add = _CORES.add
    # A test that interrupts calls at arbitrary lines (test_interrupts.py) may leave a
    # call counted and never ended: what it holds is checked, not its counters.
    counters = request.node.get_closest_marker("counters_may_drift") is None
    sweep_at = 256

    def record(core: Any) -> None:
        nonlocal sweep_at
        add(core)
        built.append(core)
        if len(built) >= sweep_at:
            kept = []
            for old in built:
                # Three references: the list's, ``old``'s and getrefcount's argument.
                if sys.getrefcount(old) > 3:
                    kept.append(old)
                else:
                    problems.extend(_ledger(old, old.audit(), counters))
            built[:] = kept
            sweep_at = max(256, 2 * len(kept))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_CORES, "add", record)
        yield
    # Collecting can only give back (a dropped lease's slot): look first, collect if needed.
    found = [p for core in built for p in _ledger(core, core.audit(), counters)]
    if found:
        gc.collect()
        found = [p for core in built for p in _ledger(core, core_held(core), counters)]
    problems += found
    if problems:
        pytest.fail("a Gate still holds, after the test:\n" + "\n".join(problems))


def _ledger(core: Any, problems: list[str], counters: bool = True) -> list[str]:
    """``problems``, and a call counted but never ended (neither ok nor failed)."""
    c = core.counters
    if counters and c.calls != c.calls_ok + c.calls_failed:
        problems = [
            *problems,
            f"{core.name}: {c.calls} calls counted, {c.calls_ok} ok, {c.calls_failed} failed",
        ]
    return problems

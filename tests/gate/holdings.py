"""What a Gate holds when no call runs: ``held(gate)``, empty when it holds nothing.

The regression tests of issue 28 end with ``assert held(gate) == []``: once every
call is over, nothing a call or an attempt acquired may still be out (a window
slot, a waiter, the breaker's probe, a quota claim, a place in a queue, a fleet
lease, a retry-budget draw, a fleet operation not yet run). The Gate says so
itself (``GateCore.audit``); a fleet's background worker may still be running
what a call handed it, so this waits briefly for that (never for anything else).
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["core_held", "held"]


def held(gate: Any, *, settle_s: float = 5.0) -> list[str]:
    """Everything ``gate`` still holds, one line each (``[]``: nothing)."""
    return core_held(gate._core, settle_s=settle_s)


def core_held(core: Any, *, settle_s: float = 5.0) -> list[str]:
    """``held``, for a Gate's core (``GateCore``)."""
    problems: list[str] = core.audit()
    shared = core.shared
    if shared is None:
        return problems
    # Operations handed to the fleet's worker thread are on their way: wait for them.
    end = time.monotonic() + settle_s
    while problems and time.monotonic() < end and any("not yet run" in p for p in problems):
        time.sleep(0.01)
        problems = core.audit()
    return problems

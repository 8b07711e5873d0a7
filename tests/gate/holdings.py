"""What a Gate holds when no call runs: ``held(gate)``, empty when it holds nothing.

The regression tests of issue 28 end with ``assert held(gate) == []``: once every
call is over, nothing a call or an attempt acquired may still be out (a window
slot, a waiter, the breaker's probe, a quota claim, a place in a queue, a fleet
lease, a fleet operation not yet run). This function is where those tests read
the Gate's internals, so that one place follows them when they change (the one
other is bug 17's test, which holds the fleet's lease renewer at its race).
"""

from __future__ import annotations

from typing import Any

__all__ = ["held"]


def held(gate: Any) -> list[str]:
    """Everything ``gate`` still holds, one line each (``[]``: nothing)."""
    core = gate._core
    out: list[str] = []
    for up in core.upstreams:
        where = f"upstream {up.name!r}"
        window = up.window
        if window.inflight:
            out.append(f"{where}: {window.inflight} window slot(s) in flight")
        if window.waiting:
            out.append(f"{where}: {window.waiting} caller(s) waiting for the window")
        breaker = up.breaker
        if breaker._probe_out or breaker.probe_pending:
            out.append(f"{where}: the breaker's probe is out ({breaker.state})")
        quota = up.quota
        if quota._pending:
            out.append(f"{where}: {len(quota._pending)} quota claim(s) taken and never sent")
        if quota._inflight:
            out.append(f"{where}: {len(quota._inflight)} quota claim(s) in flight")
        if quota._blind:
            out.append(f"{where}: blind claims in flight {dict(quota._blind)}")
        if quota.blind_requests:
            out.append(f"{where}: {quota.blind_requests} blind request(s) in flight")
        if quota._queue:
            out.append(f"{where}: {len(quota._queue)} claim(s) queued for the quota")
    rate = core.rate
    if rate is not None and rate._queue:
        out.append(f"rate cap: {len(rate._queue)} caller(s) queued for a token")
    shared = core.shared
    if shared is not None:
        if shared.leases:
            out.append(f"fleet: {len(shared.leases)} lease(s) held {sorted(shared.leases)}")
        if shared.backlog:
            ops = [op.name for op in shared.backlog]
            out.append(f"fleet: {len(ops)} operation(s) not run yet {ops}")
    return out

"""``FleetOp``: one operation of a Gate's fleet, for a driver to run (sans-IO)."""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = ["FleetOp"]


class FleetOp(NamedTuple):
    """One operation of ``yieldgate.fleet.Fleet`` to run: its name (the async form;
    ``name + "_sync"`` the sync one), arguments and keyword arguments."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = {}  # noqa: RUF012 - never mutated

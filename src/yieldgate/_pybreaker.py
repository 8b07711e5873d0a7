"""pybreaker, imported without the redis client it does not need here.

pybreaker tries ``import redis`` (and tornado) as it is imported, for its
``CircuitRedisStorage`` and its tornado calls, neither of which the Gate uses
(a fleet shares its breaker through a record of its own). With the ``fleet``
extra installed, that import costs ``import yieldgate`` 50-100 ms, and redis
brings opentelemetry-sdk with it. So the Gate imports its own copy of pybreaker
with those two imports refused, in this thread only, and leaves no trace of it
in ``sys.modules``: a caller's own ``import pybreaker`` gets the whole module,
redis support included. Where pybreaker or redis is already imported, it is
simply used.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType

__all__ = ["load"]

_SKIPPED = ("redis", "tornado")


class _Refuse:
    """A meta-path finder that refuses ``names`` (and their submodules) to one thread."""

    def __init__(self, names: tuple[str, ...], thread: int) -> None:
        self.names = names
        self.thread = thread

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if threading.get_ident() == self.thread and name.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"not imported for pybreaker: {name}", name=name)
        return None


def load() -> ModuleType:
    """The pybreaker module: the one already imported, or a private copy without redis."""
    if "pybreaker" in sys.modules or any(name in sys.modules for name in _SKIPPED):
        return importlib.import_module("pybreaker")
    refuse = _Refuse(_SKIPPED, threading.get_ident())
    sys.meta_path.insert(0, refuse)
    try:
        module = importlib.import_module("pybreaker")
    finally:
        sys.meta_path.remove(refuse)
    if sys.modules.get("pybreaker") is module:
        del sys.modules["pybreaker"]
    return module

"""Telemetry hooks that break: one ``Instrumentation`` for the ledger's tests.

``Hooks`` is an ``Instrumentation`` and the ``CallObserver`` of every call. It
counts each hook it hears in ``heard`` and raises ``HookFailed`` whenever
``fails(hook, n)`` says so for the ``n``-th call of that hook. The regression
tests break one hook once (tests/gate/test_ledger.py); the property test breaks
several, every so often (tests/gate/test_ledger_machine.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from yieldgate.gate import AttemptDetails, BreakerChange, CallDetails, WaitDetails, WindowChange

__all__ = ["HookFailed", "Hooks"]


class HookFailed(Exception):
    """What a broken telemetry hook raises."""


def _never(hook: str, n: int) -> bool:
    return False


class Hooks:
    """Counts every hook it hears; raises ``HookFailed`` when ``fails(hook, n)``."""

    def __init__(self, fails: Callable[[str, int], bool] = _never) -> None:
        self.fails = fails
        self.heard: dict[str, int] = {}

    def _hear(self, hook: str) -> None:
        n = self.heard[hook] = self.heard.get(hook, 0) + 1
        if self.fails(hook, n):
            raise HookFailed(f"{hook} is broken")

    # Instrumentation
    def start_call(self, gate: str, priority: str) -> Hooks:
        self._hear("start_call")
        return self

    def on_breaker_change(self, details: BreakerChange) -> None:
        self._hear("on_breaker_change")

    def on_window_change(self, details: WindowChange) -> None:
        self._hear("on_window_change")

    # CallObserver
    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        self._hear("scope_enter")
        try:
            yield
        finally:
            self._hear("scope_exit")

    def on_attempt(self, details: AttemptDetails) -> None:
        self._hear("on_attempt")

    def on_wait(self, details: WaitDetails) -> None:
        self._hear("on_wait")

    def on_end(self, details: CallDetails) -> None:
        self._hear("on_end")

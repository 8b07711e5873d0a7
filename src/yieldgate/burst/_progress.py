"""``Progress``: what a burst reports while it runs, and the two kinds the package makes.

``Relabelled`` puts where a strategy runs around its label (a comparison's
part, a sweep's point); ``Silent`` reports nothing. A module of its own
because every driver reports to one: a burst in one process (``_runner``),
one strategy's run (``_strategy_run``) and the worker pool (``_workers``).
"""

from __future__ import annotations

from typing import Protocol

from yieldgate.burst._results import StrategyResult

__all__ = ["Progress", "Relabelled", "Silent"]


class Progress(Protocol):
    """What the runner reports while it goes (a progress bar, say)."""

    def start(self, label: str, total: int) -> None:
        """A strategy begins."""

    def advance(self) -> None:
        """One request finished (either way)."""

    def finish(self, result: StrategyResult) -> None:
        """A strategy ended."""


class Relabelled:
    """Progress whose strategy labels carry where they run: ``before`` and ``after`` the
    label (a comparison's part, a sweep's point)."""

    def __init__(self, inner: Progress, *, before: str = "", after: str = "") -> None:
        self.inner, self.before, self.after = inner, before, after

    def start(self, label: str, total: int) -> None:
        self.inner.start(f"{self.before}{label}{self.after}", total)

    def advance(self) -> None:
        self.inner.advance()

    def finish(self, result: StrategyResult) -> None:
        self.inner.finish(result)


class Silent:
    def start(self, label: str, total: int) -> None:
        pass

    def advance(self) -> None:
        pass

    def finish(self, result: StrategyResult) -> None:
        pass

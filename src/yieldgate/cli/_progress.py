"""The progress bar of ``yieldgate burst`` and ``demo``: one rich line per strategy."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["RichProgress"]


class RichProgress:
    """A rich progress bar on stderr: one line per strategy."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.bar = Progress(
            TextColumn("{task.description:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.task: Any = None
        self.done = 0
        self.next_update = 0.0

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.bar.stop()

    def start(self, label: str, total: int) -> None:
        self.task = self.bar.add_task(label, total=total)
        self.done = 0
        self.next_update = 0.0

    def advance(self) -> None:
        # Counted here, shown at most every 50 ms: rich's update costs more than a request.
        self.done += 1
        now = time.monotonic()
        if now >= self.next_update:
            self.next_update = now + 0.05
            self.bar.update(self.task, completed=self.done)

    def finish(self, result: Any) -> None:
        self.bar.update(self.task, completed=result.requests)

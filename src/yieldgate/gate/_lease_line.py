"""The line for a fleet lease: one member's callers, by priority then arrival.

With ``FleetPolicy.inflight_cap``, an attempt is sent only with one of the
fleet's in-flight leases. A member's callers that wait for one stand in a
line per upstream, ordered as the window orders its waiters; only the head
asks Redis, and after a refusal nobody here asks again for a jittered
``poll_s``, so each member polls at one pace however many of its calls wait.
Sans-IO, under the Gate's lock: the driver that parks the head wakes it
(``Turn.wake``) when the head before it leaves.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from yieldgate.gate._upstream import Upstream
from yieldgate.gate._window import RANK
from yieldgate.protocol import Priority

__all__ = ["LeaseLine", "Turn"]


class Turn:
    """A caller's place in the line for a fleet lease; ``wake`` is its driver's."""

    __slots__ = ("gone", "wake")

    def __init__(self, wake: Callable[[], None]) -> None:
        self.wake = wake
        self.gone = False


class LeaseLine:
    """Every upstream's line for a fleet lease, and when its head may ask again."""

    def __init__(self, poll_s: float) -> None:
        self.poll_s = poll_s
        self._poll: dict[str, float] = {}  # upstream -> no lease asked before
        # Per upstream: (-rank, arrival key, seq, turn).
        self._lines: dict[str, list[tuple[int, float, int, Turn]]] = {}
        self._seq = itertools.count()

    def join(self, up: Upstream, priority: Priority, key: float, wake: Callable[[], None]) -> Turn:
        """Stand in ``up``'s line, by priority then arrival."""
        turn = Turn(wake)
        line = self._lines.setdefault(up.name, [])
        heapq.heappush(line, (-RANK[priority], key, next(self._seq), turn))
        if self._head(up) is turn and len(line) > 1:
            for _, _, _, other in line:
                if other is not turn and not other.gone:
                    other.wake()  # the old head stands back
                    break
        return turn

    def _head(self, up: Upstream) -> Turn | None:
        line = self._lines.get(up.name)
        while line and line[0][3].gone:
            heapq.heappop(line)
        return line[0][3] if line else None

    def first(self, up: Upstream, turn: Turn) -> bool:
        return self._head(up) is turn

    def leave(self, up: Upstream, turn: Turn) -> None:
        """Leave the line (leased, or gave up); a new head is woken to ask."""
        if turn.gone:
            return
        head = self._head(up) is turn
        turn.gone = True
        if head:
            after = self._head(up)
            if after is not None:
                after.wake()

    def pause(self, up: Upstream, now: float) -> float:
        """How long the head waits before asking for a lease again."""
        return self._poll.get(up.name, 0.0) - now

    def refused(self, up: Upstream, now: float, draw: float) -> None:
        """The cap is reached: nobody here asks again for a jittered ``poll_s``."""
        pause = self.poll_s * (0.5 + draw)
        self._poll[up.name] = max(self._poll.get(up.name, 0.0), now + pause)

    def waiting(self) -> int:
        """Callers in any line (for the invariant checks)."""
        return sum(1 for line in self._lines.values() for e in line if not e[3].gone)

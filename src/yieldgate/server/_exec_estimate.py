"""How long the Governor expects work to take: an execution, and a cold start.

``ExecEstimate`` follows the executions measured so far: an exponential
moving average of their times (``ewma_alpha``) and of their absolute
deviation; before any is measured, the configured ``initial_exec_ms``.
``mean_ms`` is what a slot in flight without its own estimate is expected to
take; ``residual_ms`` what work already past its expected end is still given
(the deviation, at least a tenth of the mean). Both are worked out once per
measured execution, not on every yield. ``cold_hint_ms`` is when a cold start
is expected to end.

Apart from ``governor`` because it is arithmetic on numbers alone: it knows
nothing of slots, priorities or the queue.
"""

from __future__ import annotations

from typing import Final

from yieldgate.server._governor_records import GovernorConfig

__all__ = ["ExecEstimate", "cold_hint_ms"]

# The least a late execution, or a late cold start, is still expected to take: a
# share of the mean (of the expected warm-up).
_MIN_RESIDUAL_SHARE: Final = 0.1


class ExecEstimate:
    """The measured execution times of one Governor, and what it expects of the next."""

    __slots__ = ("_config", "ewma", "ewma_dev", "mean_ms", "residual_ms", "total_ms")

    def __init__(self, config: GovernorConfig) -> None:
        self._config = config
        self.ewma: float | None = None
        self.ewma_dev = 0.0
        # Every measured execution (executed or failed), summed: with their count, the
        # mean a run's makespan bound needs (the moving average leans to the last few).
        self.total_ms = 0.0
        self._set_estimates()

    def observe(self, elapsed_ms: float) -> None:
        """Count one measured execution (executed or failed, never cancelled)."""
        self.total_ms += elapsed_ms
        if self.ewma is None:
            self.ewma = elapsed_ms
            self.ewma_dev = elapsed_ms / 2
        else:
            alpha = self._config.ewma_alpha
            self.ewma_dev += alpha * (abs(elapsed_ms - self.ewma) - self.ewma_dev)
            self.ewma += alpha * (elapsed_ms - self.ewma)
        self._set_estimates()

    def _set_estimates(self) -> None:
        mean = self.ewma if self.ewma is not None else self._config.initial_exec_ms
        self.mean_ms = mean
        self.residual_ms = max(self.ewma_dev, mean * _MIN_RESIDUAL_SHARE)


def cold_hint_ms(cold_until: float, expected_s: float, now: float) -> float:
    """When a cold start expected to last ``expected_s`` and end at ``cold_until`` ends,
    in milliseconds from ``now``."""
    remaining_s = cold_until - now
    if remaining_s <= 0:
        # Warming is taking longer than estimated: come back soon, not at once.
        remaining_s = max(expected_s * _MIN_RESIDUAL_SHARE, 0.05)
    return remaining_s * 1000.0

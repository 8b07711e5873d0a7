"""A fleet's retry budget: ``deposit``, ``withdraw``, ``refund_retry``.

Retries as a share of the whole fleet's calls, as ``RetryBudget`` counts them
for one process. One of the groups of operations ``Fleet`` is made of.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, TypeVar

from yieldgate.fleet._driver import Drivers, Op, check_count, read_flag
from yieldgate.gate._policy import RetryBudgetPolicy

__all__ = ["BudgetOps"]

T = TypeVar("T")


class BudgetOps(Drivers):
    """The retry budget of a ``Fleet``."""

    def _budget(
        self,
        upstream: str,
        policy: RetryBudgetPolicy,
        op: str,
        value: int,
        decode: Callable[[Any], T],
    ) -> Op[T]:
        args = (op, policy.window_s, policy.ratio, policy.min_per_s, value)
        return Op("budget", (self.keys.budget(upstream),), args, decode)

    @staticmethod
    def _receipt(raw: Any) -> int | Literal[False]:
        return int(raw) or False

    async def deposit(self, upstream: str, policy: RetryBudgetPolicy, n: int = 1) -> bool | None:
        """Count ``n`` new calls (first attempts) in the fleet's retry budget."""
        op = self._budget(upstream, policy, "deposit", check_count("n", n, least=1), read_flag)
        return await self._arun(op)

    def deposit_sync(self, upstream: str, policy: RetryBudgetPolicy, n: int = 1) -> bool | None:
        """``deposit``, blocking (within the budget)."""
        op = self._budget(upstream, policy, "deposit", check_count("n", n, least=1), read_flag)
        return self._run(op)

    async def withdraw(
        self, upstream: str, policy: RetryBudgetPolicy
    ) -> int | Literal[False] | None:
        """Take one retry from the fleet's budget: a receipt (for ``refund_retry``),
        ``False`` when none is left, ``None`` when Redis is unavailable.

        As ``RetryBudget``: over the last ``window_s`` (ten buckets), retries
        may number ``ratio`` times the calls deposited plus
        ``min_per_s * window_s``. Every member must use the same policy.
        """
        op = self._budget(upstream, policy, "withdraw", 0, self._receipt)

        def undo(receipt: int | Literal[False]) -> Op[bool] | None:
            if receipt is False:
                return None
            return self._budget(upstream, policy, "refund", receipt, read_flag)

        return await self._arun(dataclasses.replace(op, undo=undo))

    def withdraw_sync(
        self, upstream: str, policy: RetryBudgetPolicy
    ) -> int | Literal[False] | None:
        """``withdraw``, blocking (within the budget)."""
        op = self._budget(upstream, policy, "withdraw", 0, self._receipt)
        return self._run(op)

    async def refund_retry(
        self, upstream: str, policy: RetryBudgetPolicy, receipt: int
    ) -> bool | None:
        """Give back a withdrawn retry that was never sent (nothing once its bucket
        has left the window)."""
        op = self._budget(
            upstream, policy, "refund", check_count("receipt", receipt, least=0), read_flag
        )
        return await self._arun(op)

    def refund_retry_sync(
        self, upstream: str, policy: RetryBudgetPolicy, receipt: int
    ) -> bool | None:
        """``refund_retry``, blocking (within the budget)."""
        op = self._budget(
            upstream, policy, "refund", check_count("receipt", receipt, least=0), read_flag
        )
        return self._run(op)

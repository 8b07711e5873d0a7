"""SLO early rejection: refuse, at once, a request that would miss its TTFT objective.

Mooncake-style admission control. ``TtftEstimator`` keeps exponential moving
averages of prefill time per token and of one decode step, measured by the
engine; from them the time to first token of a new request is the prefill of
everything queued ahead of it plus its own, plus one decode step when decode
is running (the new prefill waits for the step boundary), or plus the decode
steps that must run before it can be admitted at all when that is more (with
a host KV tier, sequences swapped out under memory pressure come back before
any new prompt, so it waits for running sequences to finish and free blocks).

``QosPolicy.check`` compares that estimate with the request's priority's
objective (``SloConfig``) and answers a ``Rejection`` (``YieldReason.SLO``)
when it would be missed. Shedding load is the point, not refusing big
requests: a request is judged against the larger of its objective and its
own time on an idle server (nothing queued ahead), so a prompt too long to
ever meet its objective is still admitted when nothing is queued ahead of
it. Hence only queued work ahead causes a rejection, and ``retry_hint_ms``
is how long that queue takes to drain enough: the estimate's excess over
that bound, since the queue drains one estimated millisecond per millisecond.

"Queued ahead" follows the engine's order (``EngineLoad``): with priority
inside the engine on, a new request waits only behind the waiting work of its
own or a higher priority (and work aged past the age bound, served as high),
so a low-priority backlog does not count against a high request; off, every
queued token is ahead of every request.

The estimator is written by the engine's thread and read by the routing
thread; each average is one float assignment, so a reader sees either the
old or the new value. The load is published the same way: one ``EngineLoad``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from yieldgate.protocol import Priority
from yieldgate.server.governor import Rejection

__all__ = [
    "EngineLoad",
    "QosPolicy",
    "SloConfig",
    "TtftEstimator",
    "decode_steps_between_pieces",
    "prefill_step_counts",
]

_DEFAULT_ALPHA: Final = 0.2
# Prefill steps of fewer tokens do not move the per-token average (``observe_prefill``).
MIN_PREFILL_TOKENS: Final = 32


def _check_objective(name: str, value: object, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        allowed = "a finite number > 0 or None" if optional else "a finite number > 0"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class SloConfig:
    """Latency objectives. A ``None`` TTFT objective means that priority is never rejected.

    Nothing forces the TTFT objectives into order; with the defaults, ``low``
    (500 ms) is rejected first, ``normal`` (2 s) next, ``high`` never.
    ``tpot_ms`` (time per output token) is used for goodput only.
    """

    ttft_ms_high: float | None = None
    ttft_ms_normal: float | None = 2000.0
    ttft_ms_low: float | None = 500.0
    tpot_ms: float = 100.0

    def __post_init__(self) -> None:
        _check_objective("ttft_ms_high", self.ttft_ms_high)
        _check_objective("ttft_ms_normal", self.ttft_ms_normal)
        _check_objective("ttft_ms_low", self.ttft_ms_low)
        _check_objective("tpot_ms", self.tpot_ms, optional=False)

    def ttft_for(self, priority: Priority) -> float | None:
        """The TTFT objective of ``priority`` in milliseconds, ``None`` when it has none."""
        if priority is Priority.HIGH:
            return self.ttft_ms_high
        if priority is Priority.NORMAL:
            return self.ttft_ms_normal
        return self.ttft_ms_low


class EngineLoad(NamedTuple):
    """The load the engine thread publishes after every step, read by the SLO check as one.

    ``queued_ahead[r]``: prompt tokens waiting for a prefill ahead of a new
    request of rank ``r`` (``rank_of``: 0 high, 1 normal, 2 low), in the
    engine and at the prefill workers (``Scheduler.queued_tokens_ahead``,
    ``Disaggregation.remote_tokens_ahead``); all three equal with priority
    off. ``running``: sequences decoding. ``steps_ahead``: decode steps before
    any new prompt can be admitted (``Scheduler.decode_steps_to_admit``), the
    same for every priority: swapped-out sequences come back first.

    With prefill workers, ``local_ahead[r]`` is the engine's share of
    ``queued_ahead[r]`` (a prompt prefilled on the decode worker waits behind
    that only) and ``high_remote`` the high-priority prefills at the workers
    (what keeps a degraded prompt local); ``None`` and 0 without workers.
    """

    queued_ahead: tuple[int, int, int] = (0, 0, 0)
    running: int = 0
    steps_ahead: int = 0
    local_ahead: tuple[int, int, int] | None = None
    high_remote: int = 0


class TtftEstimator:
    """Moving averages of measured prefill and decode time, and a TTFT estimate from them.

    ``alpha`` is the newest measurement's weight. The averages may be seeded
    (from a benchmark, say); otherwise the first measurement sets them.
    ``prefill_chunk`` is the engine's (``SchedulerConfig.prefill_chunk``): while
    sequences decode, a decode step runs between two pieces of a prefill.
    """

    def __init__(
        self,
        *,
        alpha: float = _DEFAULT_ALPHA,
        prefill_ms_per_token: float | None = None,
        decode_step_ms: float | None = None,
        prefill_chunk: int = 0,
    ) -> None:
        if not (0 < alpha <= 1):
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        for name, value in (
            ("prefill_ms_per_token", prefill_ms_per_token),
            ("decode_step_ms", decode_step_ms),
        ):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 or None, got {value!r}")
        if type(prefill_chunk) is not int or prefill_chunk < 0:
            raise ValueError(f"prefill_chunk must be an integer >= 0, got {prefill_chunk!r}")
        self.alpha = alpha
        self.prefill_chunk = prefill_chunk
        self.prefill_ms_per_token = prefill_ms_per_token
        self.decode_step_ms = decode_step_ms

    def observe_prefill(self, tokens: int, ms: float) -> None:
        """A prefill computed ``tokens`` uncached tokens in ``ms``; zero tokens says nothing.

        Once the average is set, a step of fewer than ``MIN_PREFILL_TOKENS``
        (or than ``prefill_chunk``, when smaller) says nothing either: its time
        is the step's own cost, not its tokens'.
        With prefill workers, most of the decode worker's prefill steps compute
        one token (the last of a prompt whose KV arrived), and counted per
        token they took the average from 0.25 to 4.5 ms a token in a minute
        (``bench/harness_degrade.py``), so every long prompt looked 18x slower.
        """
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens}")
        _check_ms(ms)
        if not prefill_step_counts(
            tokens, chunk=self.prefill_chunk, averaged=self.prefill_ms_per_token is not None
        ):
            return
        self.prefill_ms_per_token = self._ewma(self.prefill_ms_per_token, ms / tokens)

    def observe_decode_step(self, ms: float) -> None:
        """One decode step of the running batch took ``ms``."""
        _check_ms(ms)
        self.decode_step_ms = self._ewma(self.decode_step_ms, ms)

    def _ewma(self, previous: float | None, value: float) -> float:
        return value if previous is None else previous + self.alpha * (value - previous)

    def estimate_ms(
        self,
        *,
        prompt_tokens: int,
        queued_prefill_tokens: int,
        decode_running: int,
        decode_steps_ahead: int = 0,
        on_engine: bool = True,
    ) -> float | None:
        """Expected TTFT of a new prompt of ``prompt_tokens`` uncached tokens.

        ``decode_steps_ahead``: decode steps that must run before it can be
        admitted at all (``Scheduler.decode_steps_to_admit``); it waits for
        the larger of those and the one step boundary of a running decode.
        With ``prefill_chunk`` and a running decode, the queued tokens and its
        own are computed in pieces, a decode step between two of them, when
        they are prefilled ``on_engine`` (not at a prefill worker, which
        computes a prompt in one step).
        ``None`` while a measurement it needs is missing: prefill time always,
        the decode step when any decode step is waited for.
        """
        per_token = self.prefill_ms_per_token
        if per_token is None:
            return None
        tokens = queued_prefill_tokens + prompt_tokens
        steps = max(decode_steps_ahead, 1 if decode_running > 0 else 0)
        if on_engine and decode_running > 0:
            steps += decode_steps_between_pieces(tokens, self.prefill_chunk)
        step = 0.0
        if steps:
            if self.decode_step_ms is None:
                return None
            step = steps * self.decode_step_ms
        return tokens * per_token + step


def prefill_step_counts(tokens: int, *, chunk: int, averaged: bool) -> bool:
    """Whether a prefill step of ``tokens`` uncached tokens moves a per-token average.

    Not with none; once ``averaged``, not under ``MIN_PREFILL_TOKENS``, or under
    the ``chunk`` where the engine computes prompts in smaller pieces than that
    (else its average would never move again).
    """
    least = min(MIN_PREFILL_TOKENS, chunk) if chunk else MIN_PREFILL_TOKENS
    return tokens > 0 and (tokens >= least or not averaged)


def decode_steps_between_pieces(tokens: int, chunk: int) -> int:
    """Decode steps between the pieces of ``tokens`` prefilled ``chunk`` a step (0: whole)."""
    return max(0, math.ceil(tokens / chunk) - 1) if chunk else 0


def _check_ms(ms: float) -> None:
    if not (math.isfinite(ms) and ms >= 0):
        raise ValueError(f"ms must be a finite number >= 0, got {ms!r}")


class QosPolicy:
    """Early rejection by priority: see the module docstring for the rule and the hint."""

    def __init__(self, slo: SloConfig, estimator: TtftEstimator) -> None:
        self.slo = slo
        self.estimator = estimator
        self._checked: Counter[Priority] = Counter()
        self._rejected: Counter[Priority] = Counter()

    def check(
        self,
        priority: Priority,
        *,
        prompt_tokens: int,
        queued_prefill_tokens: int,
        decode_running: int,
        decode_steps_ahead: int = 0,
        alone_ms: float | None = None,
        on_engine: bool = True,
    ) -> Rejection | None:
        """``None`` to admit, else a ``Rejection`` with a hint of when a retry may pass.

        ``alone_ms``: see ``excess_ms``; ``on_engine``: ``TtftEstimator.estimate_ms``'s.
        """
        if min(prompt_tokens, queued_prefill_tokens, decode_running, decode_steps_ahead) < 0:
            raise ValueError(
                "prompt_tokens, queued_prefill_tokens, decode_running and decode_steps_ahead"
                " must be >= 0"
            )
        self._checked[priority] += 1
        objective = self.slo.ttft_for(priority)
        if objective is None:
            return None
        excess = self.excess_ms(
            objective,
            prompt_tokens=prompt_tokens,
            queued_prefill_tokens=queued_prefill_tokens,
            decode_running=decode_running,
            decode_steps_ahead=decode_steps_ahead,
            alone_ms=alone_ms,
            on_engine=on_engine,
        )
        if excess is None or excess[0] <= excess[1]:
            return None
        self._rejected[priority] += 1
        return Rejection(retry_hint_ms=max(1, math.ceil(excess[0] - excess[1])))

    def excess_ms(
        self,
        objective: float,
        *,
        prompt_tokens: int,
        queued_prefill_tokens: int,
        decode_running: int,
        decode_steps_ahead: int = 0,
        alone_ms: float | None = None,
        on_engine: bool = True,
    ) -> tuple[float, float] | None:
        """``(estimate, bound)``: the TTFT estimate and what it is held to, ``None`` unmeasured.

        The bound is the larger of ``objective`` and the request's own TTFT
        with nothing queued ahead (no decode steps ahead either: swapped-out
        sequences are work ahead), or ``alone_ms`` instead of that TTFT where
        given (a route taken by choice is held to what its usual route would
        take alone); ``estimate / bound`` is the pressure that graceful
        degradation (``yieldgate.harness.degrade``) watches.
        """
        estimate = self.estimator.estimate_ms(
            prompt_tokens=prompt_tokens,
            queued_prefill_tokens=queued_prefill_tokens,
            decode_running=decode_running,
            decode_steps_ahead=decode_steps_ahead,
            on_engine=on_engine,
        )
        if estimate is None:
            return None
        if alone_ms is not None:
            return estimate, max(objective, alone_ms)
        idle = self.estimator.estimate_ms(
            prompt_tokens=prompt_tokens,
            queued_prefill_tokens=0,
            decode_running=decode_running,
            on_engine=on_engine,
        )
        assert idle is not None  # the same measurements as ``estimate``
        return estimate, max(objective, idle)

    def stats(self) -> dict[str, Any]:
        """Checks and rejections by priority, and the estimator's averages."""
        return {
            "checked": {p.value: self._checked[p] for p in Priority},
            "rejected": {p.value: self._rejected[p] for p in Priority},
            "prefill_ms_per_token": self.estimator.prefill_ms_per_token,
            "decode_step_ms": self.estimator.decode_step_ms,
        }

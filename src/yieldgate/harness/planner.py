"""The planner: move capacity between prefill and decode as the traffic shifts.

Seed 002 (Dynamo's planner): watch TTFT and TPOT against their objectives and
give the stage that misses its objective more of the machine: more prefill
workers when long prompts make the TTFT miss, more decode room when the TPOT
has headroom and decode is full, fewer prefill workers (their cores back to
decode) when the TPOT misses, and no prefill workers at all (colocated
serving) when too few prompts are long enough for an offload to pay.

``Planner`` is sans-IO: ``record`` finished requests (TTFT, TPOT, prompt
length) on a clock of the caller's, then ``decide(now, state)`` with the
current ``Capacity``; it answers a list of ``Decision`` (at most one per
call) and never starts or stops anything itself. ``PlannerDriver``
(``yieldgate.harness.planner_driver``) applies the decisions to a running
harness.

The rule, evaluated at most every ``interval_s``:

- **Hold** while fewer than ``min_samples`` requests finished since the last
  change, or within ``cooldown_s`` of it. The windows are emptied at each
  change, so every decision is made on traffic served under the split in
  force. Samples older than ``window_s`` are dropped, and so are those from
  before a change in the prompt mix (``mix_shift``: the newest
  ``min_samples`` differ from the rest in their share of long prompts by that
  much), so a phase that ended does not judge the next one.
- ``ttft`` and ``tpot`` are the ``percentile``-th (nearest rank) of the window;
  ``long_share`` the share of its prompts of at least ``long_prompt_tokens``.
- **Both objectives missed**: when more prompts are queued at the prefill
  workers than there are workers (at least two), the prefill side is the
  backlog: start a prefill worker (``prefill_backlog``), up to the maximum,
  if ``long_share`` is at least ``min_long_share``. Otherwise lower the
  decode batch by ``decode_step`` (``overloaded``), or hold when
  ``ttft_bounds_batch`` is off.
- **TTFT missed**: with ``long_share`` at least ``min_long_share``, start a
  prefill worker (``disaggregate`` from none, else ``ttft_over_objective``),
  up to ``max_prefill_workers``. When no prefill worker can be added (at the
  maximum, or short prompts it would not take), the first token waits in the
  queue that the decode batch (and the Governor's capacity, which moves with
  it) bounds: lower it in proportion (times the objective over the TTFT),
  by ``decode_step`` at least (``ttft_queue_bound``), or hold when
  ``ttft_bounds_batch`` is off.
- **TPOT missed**: lower the decode batch by ``decode_step``
  (``tpot_over_objective``), down to ``min_decode_seqs``. With
  ``stop_idle_workers``, first stop a prefill worker above
  ``min_prefill_workers`` that is not needed (``long_share`` under
  ``min_long_share``, or nothing queued at the workers:
  ``reassign_to_decode``).
- **Both met**: with ``stop_idle_workers`` and ``long_share`` under
  ``min_long_share``, stop a prefill worker (``colocate`` for the last one,
  else ``offload_unused``); else, when the TPOT (and with
  ``ttft_bounds_batch`` the TTFT too) is under ``headroom`` times its
  objective and decode runs full, raise the decode batch
  (``decode_headroom``: by the headroom seen, times ``headroom``, at most
  doubling, at least ``decode_step``), up to ``max_decode_seqs``, unless sequences are
  swapped out to the host KV tier (hold, ``decode_memory_bound``: memory,
  not the batch size, is short).

``stop_idle_workers`` is off by default (issue 42): an idle prefill worker
process here takes no CPU, and starting it again costs seconds (a torch
import and a model load) that serving pays for.

Every decision carries its reason and the figures behind it; ``stats()``
keeps the last ``history`` of them.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Final

from yieldgate._stats import percentile

__all__ = ["ACTIONS", "Capacity", "Decision", "Planner", "PlannerConfig"]

ACTIONS: Final = ("start_prefill_worker", "stop_prefill_worker", "set_decode_seqs")


def _positive(name: str, value: object, *, zero: bool = False) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _count(name: str, value: object, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannerConfig:
    """Objectives, bounds and pacing of the planner (see the module docstring)."""

    ttft_ms: float = 500.0
    tpot_ms: float = 100.0
    percentile: float = 90.0
    window_s: float = 10.0
    min_samples: int = 8
    interval_s: float = 1.0
    cooldown_s: float = 2.0
    min_prefill_workers: int = 0
    max_prefill_workers: int = 2
    min_decode_seqs: int = 1
    max_decode_seqs: int = 16
    decode_step: int = 2
    headroom: float = 0.5
    long_prompt_tokens: int = 128
    min_long_share: float = 0.2
    stop_idle_workers: bool = False
    ttft_bounds_batch: bool = True
    mix_shift: float | None = 0.5
    history: int = 64

    def __post_init__(self) -> None:
        _positive("ttft_ms", self.ttft_ms)
        _positive("tpot_ms", self.tpot_ms)
        _positive("window_s", self.window_s)
        _positive("interval_s", self.interval_s, zero=True)
        _positive("cooldown_s", self.cooldown_s, zero=True)
        _positive("percentile", self.percentile)
        if self.percentile > 100:
            raise ValueError(f"percentile must be in (0, 100], got {self.percentile!r}")
        _positive("headroom", self.headroom)
        if self.headroom > 1:
            raise ValueError(f"headroom must be in (0, 1], got {self.headroom!r}")
        if self.mix_shift is not None:
            _positive("mix_shift", self.mix_shift)
            if self.mix_shift > 1:
                raise ValueError(f"mix_shift must be in (0, 1] or None, got {self.mix_shift!r}")
        _positive("min_long_share", self.min_long_share, zero=True)
        if self.min_long_share > 1:
            raise ValueError(f"min_long_share must be in [0, 1], got {self.min_long_share!r}")
        _count("min_samples", self.min_samples, 1)
        _count("min_prefill_workers", self.min_prefill_workers, 0)
        _count("max_prefill_workers", self.max_prefill_workers, self.min_prefill_workers)
        _count("min_decode_seqs", self.min_decode_seqs, 1)
        _count("max_decode_seqs", self.max_decode_seqs, self.min_decode_seqs)
        _count("decode_step", self.decode_step, 1)
        _count("long_prompt_tokens", self.long_prompt_tokens, 1)
        _count("history", self.history, 1)
        for name in ("stop_idle_workers", "ttft_bounds_batch"):
            if type(getattr(self, name)) is not bool:
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Capacity:
    """The split in force and the queues, as the driver sees them when it asks."""

    prefill_workers: int
    prefill_queue: int
    decode_seqs: int
    decode_running: int
    # Sequences swapped out to the host KV tier: memory, not the batch size, holds them back.
    decode_swapped: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    """One change: ``action`` (one of ``ACTIONS``) to ``target``, why, and on what figures.

    ``target`` is the number of prefill workers after the change, or the new
    decode batch (``set_decode_seqs``).
    """

    at: float
    action: str
    target: int
    reason: str
    ttft_ms: float
    tpot_ms: float
    long_share: float
    samples: int
    capacity: Capacity

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class _Sample:
    at: float
    ttft_ms: float
    tpot_ms: float | None
    long: bool


class Planner:
    """The decision logic; feed it ``record`` and ask ``decide`` (one thread, or a lock)."""

    def __init__(self, config: PlannerConfig | None = None) -> None:
        self.config = config or PlannerConfig()
        self._samples: deque[_Sample] = deque()
        self._last_change: float | None = None
        self._last_decide: float | None = None
        self.decisions: deque[Decision] = deque(maxlen=self.config.history)
        self.decisions_total = 0
        self.last_hold: str | None = None
        self.mix_shifts = 0

    def record(
        self, now: float, *, ttft_ms: float, tpot_ms: float | None, prompt_tokens: int
    ) -> None:
        """A finished request: its TTFT, TPOT (``None`` for one output token), prompt length."""
        _positive("ttft_ms", ttft_ms, zero=True)
        if tpot_ms is not None:
            _positive("tpot_ms", tpot_ms, zero=True)
        _count("prompt_tokens", prompt_tokens, 0)
        long = prompt_tokens >= self.config.long_prompt_tokens
        self._samples.append(_Sample(now, float(ttft_ms), tpot_ms, long))

    def _expire(self, now: float) -> None:
        horizon = now - self.config.window_s
        while self._samples and self._samples[0].at < horizon:
            self._samples.popleft()

    def _forget_on_mix_shift(self) -> None:
        """Drop samples from before a change in the prompt mix: they judge other traffic.

        The newest ``min_samples`` are the traffic now; when their share of long
        prompts differs from the older samples' by ``mix_shift`` or more, the
        older ones go, so the next decision waits for neither ``window_s`` nor
        the slow requests of the phase that ended.
        """
        shift = self.config.mix_shift
        recent = self.config.min_samples
        if shift is None or len(self._samples) <= recent:
            return
        samples = list(self._samples)
        old, new = samples[:-recent], samples[-recent:]
        old_share = sum(s.long for s in old) / len(old)
        new_share = sum(s.long for s in new) / len(new)
        if abs(new_share - old_share) >= shift:
            self._samples = deque(new)
            self.mix_shifts += 1

    def decide(self, now: float, state: Capacity) -> list[Decision]:
        """The changes to make now (none or one); ``last_hold`` says why when none."""
        cfg = self.config
        if self._last_decide is not None and now - self._last_decide < cfg.interval_s:
            return []
        self._last_decide = now
        self._expire(now)
        self._forget_on_mix_shift()
        if self._last_change is not None and now - self._last_change < cfg.cooldown_s:
            return self._hold("cooldown")
        samples = list(self._samples)
        if len(samples) < cfg.min_samples:
            return self._hold("too_few_samples")
        ttft = percentile([s.ttft_ms for s in samples], cfg.percentile, default=0.0)
        tpots = [s.tpot_ms for s in samples if s.tpot_ms is not None]
        tpot = percentile(tpots, cfg.percentile, default=0.0)
        long_share = sum(s.long for s in samples) / len(samples)
        ttft_bad = ttft > cfg.ttft_ms
        tpot_bad = tpot > cfg.tpot_ms
        few_long = long_share < cfg.min_long_share
        workers = state.prefill_workers
        may_stop = cfg.stop_idle_workers and workers > cfg.min_prefill_workers
        can_lower = state.decode_seqs > cfg.min_decode_seqs
        lower = max(cfg.min_decode_seqs, state.decode_seqs - cfg.decode_step)
        action: tuple[str, int, str] | None = None
        hold = "within_objectives"
        if ttft_bad and tpot_bad:
            # Both missed: a backlog at the prefill workers says where to add.
            backlog = state.prefill_queue > max(1, workers)
            if backlog and not few_long and workers < cfg.max_prefill_workers:
                action = ("start_prefill_worker", workers + 1, "prefill_backlog")
            elif cfg.ttft_bounds_batch and can_lower:
                action = ("set_decode_seqs", lower, "overloaded")
            else:
                hold = "overloaded"
        elif ttft_bad:
            if not few_long and workers < cfg.max_prefill_workers:
                reason = "disaggregate" if workers == 0 else "ttft_over_objective"
                action = ("start_prefill_worker", workers + 1, reason)
            elif cfg.ttft_bounds_batch and can_lower:
                # No prefill to add: the wait is the queue, and the batch bounds it.
                # The wait grows with the queue: cut in proportion, at least one step.
                scaled = math.floor(state.decode_seqs * cfg.ttft_ms / ttft)
                target = max(cfg.min_decode_seqs, min(lower, scaled))
                action = ("set_decode_seqs", target, "ttft_queue_bound")
            elif few_long:
                hold = "ttft_over_objective_short_prompts"
            else:
                hold = "prefill_at_max"
        elif tpot_bad:
            idle = few_long or state.prefill_queue == 0
            if may_stop and idle:
                action = ("stop_prefill_worker", workers - 1, "reassign_to_decode")
            elif can_lower:
                action = ("set_decode_seqs", lower, "tpot_over_objective")
            else:
                hold = "decode_at_min"
        elif few_long and may_stop:
            reason = "colocate" if workers == 1 else "offload_unused"
            action = ("stop_prefill_worker", workers - 1, reason)
        elif (
            tpot <= cfg.headroom * cfg.tpot_ms
            and (not cfg.ttft_bounds_batch or ttft <= cfg.headroom * cfg.ttft_ms)
            and state.decode_running >= state.decode_seqs
            and state.decode_seqs < cfg.max_decode_seqs
        ):
            if state.decode_swapped:
                # A bigger batch would admit more than the KV memory holds: more swapping.
                hold = "decode_memory_bound"
            else:
                # Grow with the headroom seen (at most doubling), by a step at least.
                ratios = [cfg.tpot_ms / tpot if tpot > 0 else math.inf]
                if cfg.ttft_bounds_batch:
                    ratios.append(cfg.ttft_ms / ttft if ttft > 0 else math.inf)
                grown = state.decode_seqs * min(2.0, cfg.headroom * min(ratios))
                target = max(state.decode_seqs + cfg.decode_step, math.floor(grown))
                action = ("set_decode_seqs", min(cfg.max_decode_seqs, target), "decode_headroom")
        if action is None:
            return self._hold(hold)
        name, target, reason = action
        decision = Decision(
            at=now,
            action=name,
            target=target,
            reason=reason,
            ttft_ms=ttft,
            tpot_ms=tpot,
            long_share=long_share,
            samples=len(samples),
            capacity=state,
        )
        self.decisions.append(decision)
        self.decisions_total += 1
        self.last_hold = None
        self._last_change = now
        self._samples.clear()
        return [decision]

    def _hold(self, reason: str) -> list[Decision]:
        self.last_hold = reason
        return []

    def stats(self) -> dict[str, Any]:
        """The decisions so far (the last ``history``), their count, and the last hold's reason."""
        return {
            "decisions_total": self.decisions_total,
            "decisions": [d.to_dict() for d in self.decisions],
            "last_hold": self.last_hold,
            "mix_shifts": self.mix_shifts,
            "samples": len(self._samples),
            "config": asdict(self.config),
        }

"""The planner's driver: applies ``Planner`` decisions to a running harness.

A thread of its own (starting a prefill worker process takes seconds: torch
import and model load, which must not stall the engine thread or the event
loop). Every ``PlannerConfig.interval_s`` it reads the split in force, asks
the planner, and carries out what it decides:

- ``start_prefill_worker``: ``PrefillPool.launch_worker`` here, then the
  engine thread adopts it (``adopt``) and the router may use it;
- ``stop_prefill_worker``: the engine thread retires the least loaded worker;
  it finishes its queue and its process is then told to stop;
- ``set_decode_seqs``: the engine's ``max_num_seqs`` (on the engine thread)
  and the Governor's capacity (on the event loop), together.

Each decision is logged as one structured record (logger
``yieldgate.harness.planner``, the decision under ``extra["planner"]``) and
kept in the planner's ``stats()``; a change that fails is logged and counted
(``failures``), and the planner goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from yieldgate.harness.planner import Capacity, Decision, Planner

__all__ = ["PlannerDriver"]

log = logging.getLogger("yieldgate.harness.planner")


class PlannerDriver:
    """Runs ``planner`` against a harness through the four callables it is given.

    ``capacity()`` reads the split in force; ``start_worker()`` launches and
    adopts one prefill worker (blocking until it serves); ``stop_worker()``
    retires one; ``set_decode_seqs(n)`` changes the decode batch. ``lock``
    guards the planner, which the event loop feeds (``record``) meanwhile.
    """

    def __init__(
        self,
        planner: Planner,
        lock: threading.Lock,
        *,
        capacity: Callable[[], Capacity],
        start_worker: Callable[[], None],
        stop_worker: Callable[[], None],
        set_decode_seqs: Callable[[int], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.planner = planner
        self._lock = lock
        self._capacity = capacity
        self._start_worker = start_worker
        self._stop_worker = stop_worker
        self._set_decode_seqs = set_decode_seqs
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.applied = 0

    def start(self) -> None:
        thread = threading.Thread(target=self._run, name="yieldgate-planner", daemon=True)
        self._thread = thread
        thread.start()

    def close(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None

    def _run(self) -> None:
        period = max(0.05, self.planner.config.interval_s)
        while not self._stop.wait(period):
            self.tick()

    def tick(self) -> list[Decision]:
        """One round: read, decide, apply. The thread calls it; tests may too."""
        state = self._capacity()
        with self._lock:
            decisions = self.planner.decide(self._clock(), state)
        for decision in decisions:
            record = decision.to_dict()
            log.info(
                "planner: %s -> %d (%s; TTFT %.1f ms, TPOT %.1f ms, long prompts %.0f%%)",
                decision.action,
                decision.target,
                decision.reason,
                decision.ttft_ms,
                decision.tpot_ms,
                decision.long_share * 100,
                extra={"planner": record},
            )
            try:
                self._apply(decision)
            except Exception:
                self.failures += 1
                log.exception("planner: %s failed", decision.action)
            else:
                self.applied += 1
        return decisions

    def _apply(self, decision: Decision) -> None:
        if decision.action == "start_prefill_worker":
            self._start_worker()
        elif decision.action == "stop_prefill_worker":
            self._stop_worker()
        elif decision.action == "set_decode_seqs":
            self._set_decode_seqs(decision.target)
        else:  # pragma: no cover - the planner's vocabulary is fixed
            raise ValueError(f"unknown planner action {decision.action!r}")

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out = self.planner.stats()
        out["applied"] = self.applied
        out["failures"] = self.failures
        return out

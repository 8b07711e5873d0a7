"""Disaggregated prefill, on the decode worker's engine thread.

``Disaggregation`` decides, for each new request, where its prompt is
prefilled: here (colocated with decode) or on a prefill worker, by the
``Router`` (seed 002's conditional disaggregation plus a latency cost per
worker). A remote prefill reserves the request's KV blocks here first, then
sends the job; the KV comes back over ``torch.distributed`` into those very
blocks, and the decode worker computes the prompt's last token itself, in
its next prefill step.

Faults: a worker that reports failure or dies leaves its requests holding
their blocks; they are prefilled locally instead, so nothing hangs and
nothing is lost. A dead worker is never chosen again.

Degradation: a prompt whose priority ``Degrader.prefill_locally`` keeps off
the workers (they are busy with high-priority prompts) is prefilled here,
whatever the router's length rule says (route reason ``yield_to_high``).

Workers come and go (the planner): ``adopt`` one launched elsewhere,
``retire`` one (it drains, then stops). A dead or retired worker is never
chosen again.

Every method runs on the engine thread, except the pool callbacks, which
only put events into the engine's inbox.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from yieldgate.harness.degrade import Degrader
from yieldgate.harness.engine import Engine
from yieldgate.harness.prefill_pool import PrefillPool, WorkerState
from yieldgate.harness.prefill_worker import WorkerSpec
from yieldgate.harness.router import PrefixTracker, Route, Router, WorkerLoad
from yieldgate.harness.sequence import Sequence, SequenceStatus
from yieldgate.protocol import Priority

__all__ = ["Disaggregation"]

log = logging.getLogger("yieldgate.harness.prefill")

Post = Callable[[str, Any], None]


class Disaggregation:
    """Routes prompts to prefill workers and folds their KV back into the engine."""

    def __init__(
        self,
        engine: Engine,
        router: Router,
        num_workers: int,
        spec: WorkerSpec,
        post: Post,
        *,
        degrader: Degrader | None = None,
    ) -> None:
        self.engine = engine
        self.router = router
        self.degrader = degrader
        self.pool = PrefillPool(
            num_workers,
            spec,
            on_kv=lambda rid, start, kv, stats: post("kv", (rid, start, kv, stats)),
            on_failed=lambda rid, reason: post("remote_failed", (rid, reason)),
            on_dead=lambda index: post("worker_dead", index),
            priority=engine.config.scheduler.priority,
            age_bound=engine.config.scheduler.priority_age_bound,
        )
        # By worker index (indices are never reused).
        self.trackers: dict[int, PrefixTracker] = {}
        self.remote_prefills = 0
        self.local_prefills = 0
        self.fallbacks = 0
        self.dead_workers = 0

    def start(self) -> None:
        self.pool.start()

    def close(self) -> None:
        self.pool.close()

    # -- the planner's changes ---------------------------------------------------

    def adopt(self, worker: WorkerState) -> None:
        """Put a worker launched by ``pool.launch_worker`` into service."""
        self.pool.adopt(worker)

    def retire(self) -> int | None:
        """Retire the active worker with the least queued (the newest on a tie); its index."""
        active = self.pool.active_workers()
        if not active:
            return None
        worker = min(active, key=lambda w: (w.queued_tokens, -w.index))
        self.pool.retire(worker.index)
        return worker.index

    def _stop_drained(self) -> None:
        for worker in self.pool.workers:
            if not worker.accepting and not worker.stopped:
                self.pool.stop_if_drained(worker)

    def _tracker(self, index: int) -> PrefixTracker:
        tracker = self.trackers.get(index)
        if tracker is None:
            # The worker's cache holds at most its pool: the tracker forgets no later.
            tracker = self.trackers[index] = PrefixTracker(
                self.engine.config.block_size, capacity_blocks=self.pool.spec.num_blocks
            )
        return tracker

    def worker_loads(self, tokens: list[int], rank: int = 1) -> list[WorkerLoad]:
        """Each worker's load as a job of ``rank`` sees it: with priority on, only
        the jobs it would wait behind."""
        loads = []
        for worker in list(self.pool.workers):
            queued, queued_tokens = worker.queued, worker.queued_tokens
            if self.pool.priority:
                queued, queued_tokens = worker.jobs.queued_for(rank, self.pool.age_bound)
            loads.append(
                WorkerLoad(
                    index=worker.index,
                    alive=worker.active,
                    queued=queued,
                    queued_tokens=queued_tokens,
                    cached_tokens=self._tracker(worker.index).match(tokens),
                )
            )
        return loads

    def remote_tokens_ahead(self) -> tuple[int, int, int]:
        """Prompt tokens queued at the prefill workers ahead of a new job of rank 0, 1 and 2.

        Per live worker (they run in parallel). With priority on, a worker's
        queue as ``worker_loads`` shows it to the router for that rank: the jobs
        sent and the held ones served first; off, every job at every rank.
        """
        alive = [worker for worker in list(self.pool.workers) if worker.alive]
        if not alive:
            return 0, 0, 0
        totals = [0, 0, 0]
        for worker in alive:
            if self.pool.priority:
                ahead = [tokens for _, tokens in worker.jobs.ahead(self.pool.age_bound)]
            else:
                ahead = [worker.queued_tokens] * 3
            for rank in range(3):
                totals[rank] += ahead[rank]
        high, normal, low = (total // len(alive) for total in totals)
        return high, normal, low

    def route(self, seq: Sequence, priority: Priority = Priority.NORMAL) -> Route:
        """Where ``seq``'s prompt should be prefilled now."""
        degrader = self.degrader
        keep_local = degrader is not None and degrader.prefill_locally(
            priority, self.pool.high_jobs_queued()
        )
        route = self.router.route(
            prompt_tokens=len(seq.tokens),
            prefix_hit_tokens=self.engine.blocks.cached_prefix(seq.tokens),
            decode_running=self.engine.scheduler.num_decoding,
            workers=self.worker_loads(seq.tokens, seq.rank),
            keep_local=keep_local,
        )
        if degrader is not None and route.reason == "yield_to_high":
            degrader.record_local_prefill()
        return route

    def place(self, seq: Sequence, priority: Priority = Priority.NORMAL) -> Route:
        """Schedule a new ``seq``: on a prefill worker when routed there and possible."""
        route = self.route(seq, priority)
        worker = route.worker
        if route.remote and worker is not None and not self.pool.spec.holds(len(seq.tokens)):
            # Only a spec not sized by the engine's longest prompt lets this happen.
            log.warning("%r is longer than a prefill worker's KV pool; prefilling it here", seq)
            self.fallbacks += 1
            worker = None
        if route.remote and worker is not None and self.engine.reserve_remote(seq):
            if self.pool.submit(worker, seq.id, seq.tokens, seq.num_cached, rank=seq.rank):
                self._tracker(worker).record(seq.tokens)
                self.remote_prefills += 1
                return route
            self.engine.remote_failed(seq)  # the worker is gone: prefill here
            self.fallbacks += 1
            return route
        self.engine.scheduler.add(seq)
        self.local_prefills += 1
        return route

    # -- events from the pool (through the engine's inbox) ---------------------

    def abort(self, seq: Sequence) -> None:
        """Stop ``seq``: a prefill job still held for a worker is dropped, unsent."""
        if seq.status is SequenceStatus.REMOTE:
            self.pool.cancel(seq.id)
        self.engine.abort(seq)

    def kv_arrived(self, seq: Sequence | None, start: int, kv: torch.Tensor) -> None:
        self._stop_drained()
        if seq is None or seq.status is not SequenceStatus.REMOTE:
            return  # aborted meanwhile: its blocks are already free
        try:
            self.engine.write_kv(seq, start, kv)
        except ValueError:
            log.exception("KV for %r does not fit; prefilling it here", seq)
            self.fallback(seq)

    def fallback(self, seq: Sequence | None) -> None:
        self._stop_drained()
        if seq is not None and seq.status is SequenceStatus.REMOTE:
            self.engine.remote_failed(seq)
            self.fallbacks += 1

    def worker_died(self, index: int) -> None:
        self.dead_workers += 1
        log.warning("prefill worker %d is gone; routing around it", index)

    def stats(self) -> dict[str, Any]:
        placed = self.remote_prefills + self.local_prefills
        out = self.pool.stats()
        out.update(
            {
                "remote_prefills": self.remote_prefills,
                "local_prefills": self.local_prefills,
                "offload_ratio": self.remote_prefills / placed if placed else 0.0,
                "prefill_fallbacks": self.fallbacks,
                "prefill_workers_dead": self.dead_workers,
                "router": self.router.stats(),
            }
        )
        return out

"""The engine thread of ``HarnessBackend``: apply the inbox, step, hand the tokens back.

``HarnessBackend`` (``yieldgate.harness.backend``) inherits this half from
``EngineThread``. The thread blocks on the inbox only while the engine has no
work; between steps it applies what the event loop queued (adds, aborts,
and with prefill workers their KV, failures and deaths), publishes the load
the SLO check reads, and posts each step's tokens to the loop in one
``call_soon_threadsafe``. A step that raises fails the requests in flight
and the thread goes on; a crash of the thread itself fails them all.
``Request`` is one submit's state, shared by both sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Any

import anyio

from yieldgate.harness.disagg import Disaggregation
from yieldgate.harness.engine import Engine, StepResult
from yieldgate.harness.metrics import ServingMetrics
from yieldgate.harness.qos import EngineLoad, QosPolicy
from yieldgate.harness.sequence import SamplingParams, Sequence, SequenceStatus, rank_of
from yieldgate.protocol import Priority

__all__ = ["EngineThread", "Request"]

log = logging.getLogger("yieldgate.harness")


class Request:
    """One submit's state, shared between the event loop and the engine thread."""

    __slots__ = (
        "error",
        "finished",
        "first_token_at",
        "last_token_at",
        "pending",
        "priority",
        "prompt",
        "sampling",
        "seq",
        "started_at",
        "token_times",
        "wakeup",
    )

    def __init__(
        self, prompt: list[int], sampling: SamplingParams, priority: Priority = Priority.NORMAL
    ) -> None:
        self.prompt = prompt
        self.sampling = sampling
        self.priority = priority
        self.seq: Sequence | None = None  # set by the engine thread
        self.started_at = time.monotonic()
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.pending: list[int] = []
        self.token_times: list[float] = []
        self.finished = False
        self.error: BaseException | None = None
        self.wakeup = anyio.Event()


class EngineThread:
    """The engine thread's side of ``HarnessBackend``, which sets what is declared here."""

    engine: Engine | None
    disagg: Disaggregation | None
    metrics: ServingMetrics
    qos: QosPolicy | None
    _inbox: queue.SimpleQueue[tuple[str, Any]]
    _live: dict[int, Request]
    _load_now: EngineLoad
    _loop: asyncio.AbstractEventLoop | None
    _metrics_lock: threading.Lock
    _stopped: bool
    _tokens_taken: list[int]

    # -- the engine thread ----------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        assert engine is not None
        stopped: BaseException = RuntimeError("the engine stopped")
        try:
            self._step_until_stopped(engine)
        except Exception as exc:  # a bug: say so, and fail what is in flight
            log.exception("the engine thread crashed")
            stopped = exc
        finally:
            self._stopped = True
            self._post([(request, None, False) for request in self._live.values()], error=stopped)
            self._live.clear()

    def _step_until_stopped(self, engine: Engine) -> None:
        while True:
            # Block for new requests only when nothing is running.
            if not self._drain(block=not engine.has_work):
                return
            try:
                result = engine.step()
            except Exception as exc:
                log.exception("engine step failed; failing the requests in flight")
                self._fail_all(engine, exc)
                continue
            if result is None:
                if engine.has_work:
                    # Waiting work that cannot be scheduled yet (no blocks): nothing
                    # running will free any, so this would spin; it cannot happen
                    # with the admission checks, but never busy-loop if it does.
                    time.sleep(0.001)
                continue
            if self.qos is not None:
                estimator = self.qos.estimator
                if result.is_prefill:
                    estimator.observe_prefill(result.num_new_tokens, result.duration_ms)
                else:
                    estimator.observe_decode_step(result.duration_ms)
            self._publish_load(engine)
            self._publish(result)

    def _drain(self, *, block: bool) -> bool:
        """Apply queued adds and aborts; ``False`` once asked to stop."""
        engine = self.engine
        assert engine is not None
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            op, payload = item
            if op == "stop":
                return False
            try:
                self._apply(engine, op, payload)
            except Exception as exc:
                # Never let one bad event end the engine thread: whatever it was
                # about fails, everything else goes on.
                log.exception("engine thread: handling %r failed", op)
                if op == "add":
                    self._forget(engine, payload)
                    self._post([(payload, None, False)], error=exc)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                self._publish_load(engine)
                return True

    def _apply(self, engine: Engine, op: str, payload: Any) -> None:
        disagg = self.disagg
        if op == "add":
            request: Request = payload
            self._tokens_taken[rank_of(request.priority)] += len(request.prompt)
            try:
                request.seq = seq = engine.create(
                    request.prompt, request.sampling, request.priority
                )
            except ValueError as exc:
                self._post([(request, None, False)], error=exc)
                return
            self._live[seq.id] = request
            if disagg is None:
                engine.scheduler.add(seq)
                remote = False
            else:
                disagg.place(seq, request.priority)
                remote = seq.status is SequenceStatus.REMOTE
            with self._metrics_lock:
                self.metrics.record_route(remote)
        elif op == "abort":
            request = payload
            if request.seq is not None and self._live.pop(request.seq.id, None) is not None:
                if disagg is not None:
                    disagg.abort(request.seq)
                else:
                    engine.abort(request.seq)
        elif disagg is not None and op == "kv":
            request_id, start, kv, transfer = payload
            with self._metrics_lock:
                self.metrics.record_transfer(nbytes=transfer.nbytes, ms=transfer.transfer_ms)
            if self.qos is not None and kv.shape[2]:
                self.qos.estimator.observe_prefill(kv.shape[2], transfer.compute_ms)
            disagg.kv_arrived(self._seq(request_id), start, kv)
        elif disagg is not None and op == "remote_failed":
            request_id, _reason = payload
            disagg.fallback(self._seq(request_id))
        elif disagg is not None and op == "worker_dead":
            disagg.worker_died(payload)
        # The planner's changes; ``done`` tells its thread they are in force.
        elif disagg is not None and op == "adopt":
            worker, done = payload
            disagg.adopt(worker)
            done.set()
        elif disagg is not None and op == "retire":
            disagg.retire()
            payload.set()
        elif op == "decode_seqs":
            count, done = payload
            sched = engine.scheduler
            sched.config = dataclasses.replace(sched.config, max_num_seqs=count)
            done.set()

    def _publish_load(self, engine: Engine) -> None:
        sched = engine.scheduler
        local = ahead = sched.queued_tokens_ahead()
        disagg = self.disagg
        if disagg is not None:
            remote = disagg.remote_tokens_ahead()
            ahead = (ahead[0] + remote[0], ahead[1] + remote[1], ahead[2] + remote[2])
        # One assignment, so the routing thread reads the load whole.
        self._load_now = EngineLoad(
            ahead,
            len(sched.running),
            sched.decode_steps_to_admit(),
            None if disagg is None else local,
            0 if disagg is None else disagg.pool.high_jobs_queued(),
        )

    def _forget(self, engine: Engine, request: Request) -> None:
        """Drop a request whose placement failed, wherever it got to."""
        seq = request.seq
        if seq is None:
            return
        self._live.pop(seq.id, None)
        try:
            engine.abort(seq)
        except ValueError:  # it never reached a queue
            seq.status = SequenceStatus.FINISHED
            if seq.block_table:
                engine.blocks.free(seq)

    def _seq(self, request_id: int) -> Sequence | None:
        request = self._live.get(request_id)
        return None if request is None else request.seq

    def _publish(self, result: StepResult) -> None:
        now = time.monotonic()
        finished = {seq.id for seq in result.finished}
        events: list[tuple[Request, int | None, bool]] = []
        for seq, token in zip(result.seqs, result.tokens, strict=True):
            request = self._live.get(seq.id)
            if request is not None:
                events.append((request, token, seq.id in finished))
        for seq_id in finished:
            self._live.pop(seq_id, None)
        self._post(events, now)

    def _post(
        self,
        events: list[tuple[Request, int | None, bool]],
        now: float = 0.0,
        *,
        error: BaseException | None = None,
    ) -> None:
        """Hand ``events`` to the event loop; requests are only touched there from now on."""
        loop = self._loop
        if loop is None or not events or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._deliver, events, now, error)

    @staticmethod
    def _deliver(
        events: list[tuple[Request, int | None, bool]], now: float, error: BaseException | None
    ) -> None:
        for request, token, finished in events:
            if error is not None:
                request.error = error
            if token is not None:
                if request.first_token_at is None:
                    request.first_token_at = now
                request.last_token_at = now
                request.pending.append(token)
                request.token_times.append(now)
            request.finished = request.finished or finished
            request.wakeup.set()

    def _fail_all(self, engine: Engine, exc: BaseException) -> None:
        failed = list(self._live.values())
        for request in failed:
            if request.seq is not None:
                engine.abort(request.seq)
        self._live.clear()
        self._post([(request, None, False) for request in failed], error=exc)

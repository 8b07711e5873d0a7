"""``yieldgate serve --backend harness``: the engine as a backend of the governed server.

The engine steps on a thread of its own (torch releases the GIL inside its
kernels, so the fronts keep answering while a step computes). Requests reach
it through an inbox; each step's tokens come back to the event loop in one
``call_soon_threadsafe``. A cancelled request (deadline, disconnect,
shutdown) is aborted at the next step boundary and its KV blocks are freed.

Loading and warming the model is a real cold start: the Governor answers
``cold_start`` until the engine has run a warm-up prefill and a few decode
steps, which also give the first measurements for its retry hints. The
Governor's capacity is the engine's ``max_num_seqs`` (the CLI sets one from
the other), so what the Governor admits runs at once instead of queueing
inside the engine.

A request's body is its prompt, in bytes (UTF-8). ``params``: ``max_tokens``
(default ``HarnessConfig.default_max_tokens``), ``temperature`` (0, the
default, is greedy), ``seed``, ``stop`` (stop sequences, which end the
generation and are cut from its text), ``top_p`` (nucleus sampling, a
number in (0, 1]) and ``logprobs`` (an integer in [0, 20]: each token's
log-probability and that many most likely alternatives). Streams get one
chunk per token: ``{"text": ..., "token_ids": [id]}`` (a byte's id is its
value; the text is empty while a character is incomplete), plus
``"logprobs": [entry]`` when asked, the last with ``"last": true``. The result: ``text``,
``prompt_tokens``, ``completion_tokens``, ``prompt_token_ids``,
``token_ids``, ``cached_tokens`` (prompt tokens
found in the prefix cache), ``ttft_ms``, ``tpot_ms``, ``e2e_ms``,
``preemptions`` and ``finish_reason`` (``"length"``, or ``"stop_sequence"``
with the sequence found in ``stop_sequence``), and when asked
``logprobs``: one entry per token, ``{"id", "logprob",
"top": [{"id", "logprob"}, ...]}`` (see ``TokenLogprob`` for which
distribution), computed by the engine where the logits are: with prefill
workers too, since the decode worker always computes a prompt's last
position itself and samples the first token there.

Graceful degradation (``HarnessConfig.degrade``, ``yieldgate.harness.degrade``):
a request whose output was cut carries ``"degraded": {"max_tokens",
"requested_max_tokens", "level", "reason": "overload"}`` in its result (and
in its stream's first chunk). The planner (``HarnessConfig.planner``) runs
on a thread of its own (``yieldgate.harness.planner_driver``).

Here: ``HarnessBackend``'s loop side (start-up and warm-up, the SLO check,
executing requests, stats). The engine thread's side, which it inherits, is
``_engine_thread``; reading a request and writing its result,
``_backend_requests``; ``HarnessConfig`` (re-exported here), ``_backend_config``.
"""

from __future__ import annotations

import asyncio
import codecs
import dataclasses
import itertools
import logging
import math
import queue
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import torch

from yieldgate.harness._backend_config import WARMUP_TOKENS, HarnessConfig, degrade_objective
from yieldgate.harness._backend_requests import logprob_entry, parse_work, result_of
from yieldgate.harness._engine_thread import EngineThread, Request
from yieldgate.harness.degrade import Degrader
from yieldgate.harness.disagg import Disaggregation
from yieldgate.harness.engine import Engine
from yieldgate.harness.metrics import ServingMetrics
from yieldgate.harness.planner import Capacity, Planner, PlannerConfig
from yieldgate.harness.planner_driver import PlannerDriver
from yieldgate.harness.qos import EngineLoad, QosPolicy, TtftEstimator
from yieldgate.harness.router import Router, RouterConfigFile
from yieldgate.harness.sequence import SamplingParams, rank_of
from yieldgate.protocol import Priority
from yieldgate.server.backends import BackendError, Emit, StopText, Work, stop_sequences
from yieldgate.server.governor import AdmissionHook, AdmissionRequest, Governor, Rejection

__all__ = ["HarnessBackend", "HarnessConfig"]

log = logging.getLogger("yieldgate.harness")

# A warm-up prompt long enough to exercise a multi-block prefill.
_WARMUP_PROMPT = list(b"yieldgate warm-up: " * 8)
# Rough start-up time of one prefill worker process (torch import, model load).
_WORKER_START_S = 2.0


def _warmup_prompt(engine: Engine) -> list[int]:
    """The warm-up prompt, cut to what a small cache or batch budget can run at all."""
    config = engine.config
    room = min(
        config.num_blocks * config.block_size - WARMUP_TOKENS,
        config.scheduler.max_num_batched_tokens,
        engine.model.config.max_seq_len - WARMUP_TOKENS,
    )
    return _WARMUP_PROMPT[: max(1, room)]


class HarnessBackend(EngineThread):
    """Serves ``TinyTransformer`` with continuous batching behind the Governor."""

    name = "harness"
    # The optional params it honours (``yieldgate.server.backends.features_of``).
    features = frozenset({"logprobs", "top_p"})

    def __init__(self, config: HarnessConfig | None = None) -> None:
        self.config = config or HarnessConfig()
        self.engine: Engine | None = None
        self.disagg: Disaggregation | None = None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[int, Request] = {}  # engine thread only
        self._closed = False
        self._stopped = False  # the engine thread has ended
        cfg = self.config
        self.metrics = ServingMetrics(cfg.slo)
        self._metrics_lock = threading.Lock()  # recorded from both threads
        # Degradation reads the same estimate as early rejection.
        estimator = TtftEstimator(prefill_chunk=cfg.engine.scheduler.prefill_chunk)
        self.qos = QosPolicy(cfg.slo, estimator) if cfg.qos or cfg.degrade else None
        self.degrader = Degrader(cfg.degrade) if cfg.degrade is not None else None
        self._degrade_objective = (
            degrade_objective(cfg.degrade, cfg.slo) if cfg.degrade is not None else None
        )
        self.planner: PlannerDriver | None = None
        # Published by the engine thread for the admission hook, as one tuple.
        self._load_now = EngineLoad()
        # Prompt tokens handed to the engine thread (written on the loop only) and
        # taken in by it (written on the engine thread only), by rank: the
        # difference is what waits in the inbox, a queue the engine has not seen yet.
        self._tokens_sent = [0, 0, 0]
        self._tokens_taken = [0, 0, 0]

    # -- lifecycle ------------------------------------------------------------

    async def start(self, governor: Governor) -> None:
        # Each prefill worker is a process that imports torch and loads the model.
        expected_s = self.config.expected_load_s + _WORKER_START_S * self.config.prefill_workers
        governor.begin_cold_start(expected_s)
        # Admit no more than the engine runs at once: anything beyond would wait
        # in the engine's queue, the very buffering the Governor exists to refuse.
        max_num_seqs = self.config.engine.scheduler.max_num_seqs
        if governor.config.max_inflight > max_num_seqs:
            governor.set_capacity(max_num_seqs)
        if self.qos is not None:
            governor.admission_hook = _chain(governor.admission_hook, self._check_slo)
        self._loop = asyncio.get_running_loop()
        # Per process, and the engine thread's kernels are the only torch work here.
        torch.set_num_threads(self.config.torch_threads)
        started = time.monotonic()
        self.engine = await anyio.to_thread.run_sync(self._load)
        if self._closed:
            return
        if self.config.planner is not None:
            # The planner moves the decode batch and the Governor's capacity together.
            sched = self.engine.scheduler
            count = min(sched.config.max_num_seqs, governor.capacity)
            sched.config = dataclasses.replace(sched.config, max_num_seqs=count)
        self._thread = threading.Thread(target=self._run, name="yieldgate-engine", daemon=True)
        self._thread.start()
        log.info(
            "harness engine on %s ready in %.2fs", self.engine.device, time.monotonic() - started
        )
        if self.config.planner is not None:
            self.planner = self._planner_driver(self.config.planner, governor)
            self.planner.start()
        governor.mark_warm()

    def _load(self) -> Engine:
        engine = Engine(self.config.engine)
        # Warm-up: the first kernels are slow to start, and the Governor's
        # hints need a measured prefill and decode speed from the first request on.
        engine.generate([_warmup_prompt(engine)], SamplingParams(max_tokens=WARMUP_TOKENS))
        engine.reset_counters()
        if self.qos is not None:
            estimator = self.qos.estimator
            estimator.prefill_ms_per_token = engine.prefill_ms_per_token
            estimator.decode_step_ms = engine.decode_step_ms
        cfg = self.config
        if cfg.prefill_workers or cfg.planner is not None:
            router = Router(
                RouterConfigFile(cfg.router) if isinstance(cfg.router, Path) else cfg.router
            )
            disagg = Disaggregation(
                engine,
                router,
                cfg.prefill_workers,
                cfg.worker_spec(engine.max_prompt_tokens),
                self._inbox_put,
                degrader=self.degrader,
            )
            disagg.start()  # spawns the workers and waits until they have loaded
            self.disagg = disagg
        return engine

    def _inbox_tokens_ahead(self, rank: int) -> int:
        """Prompt tokens in the inbox that a new request of ``rank`` will wait behind.

        With priority inside the engine, those of its own or a higher priority
        (the engine takes them in before it, then serves by priority); off, all.
        """
        ranks = rank + 1 if self.config.engine.scheduler.priority else 3
        sent, taken = self._tokens_sent, self._tokens_taken
        return sum(max(0, sent[r] - taken[r]) for r in range(ranks))

    def _check_slo(self, request: AdmissionRequest) -> Rejection | None:
        """Early rejection and degradation: yield ``slo`` when this request must not run now.

        With degradation, every check is also a pressure reading, and a
        degraded priority is rejected at a rejecting level. Without ``qos`` it
        is otherwise admitted (its output may be cut, in ``execute``); with
        ``qos`` too it is held to early rejection's rule on the queue of the
        route it will take: the engine's alone when it will be kept local.
        """
        assert self.qos is not None
        load = self._load_now
        queued, running, steps_ahead = load.queued_ahead, load.running, load.steps_ahead
        prompt_tokens = len(request.body.encode("utf-8"))
        rank = rank_of(request.priority)
        queued_tokens = queued[rank] + self._inbox_tokens_ahead(rank)
        alone_ms = None
        # Prefilled on the decode worker (in pieces, with a chunk), not at a prefill worker.
        on_engine = load.local_ahead is None
        degrader = self.degrader
        if degrader is not None:
            assert self._degrade_objective is not None
            # Pressure is the degraded priorities' (the lowest of them sees the
            # most queued ahead), whichever priority this reading comes with.
            pressure_rank = max(rank_of(p) for p in degrader.config.priorities)
            excess = self.qos.excess_ms(
                self._degrade_objective,
                prompt_tokens=prompt_tokens,
                queued_prefill_tokens=queued[pressure_rank]
                + self._inbox_tokens_ahead(pressure_rank),
                decode_running=running,
                decode_steps_ahead=steps_ahead,
                on_engine=on_engine,
            )
            now = time.monotonic()
            if excess is not None:
                degrader.observe(now, excess[0] / excess[1])
            if request.priority in degrader.config.priorities:
                verdict = degrader.verdict(request.priority, now)
                if verdict.reject:
                    degrader.record(verdict)
                    hint = 1 if excess is None else max(1, math.ceil(excess[0] - excess[1]))
                    return Rejection(retry_hint_ms=hint)
                if not self.config.qos:
                    return None
                if load.local_ahead is not None and degrader.prefill_locally(
                    request.priority, load.high_remote
                ):
                    # Prefilled on the decode worker: the workers' queue is not ahead.
                    queued_tokens = load.local_ahead[rank] + self._inbox_tokens_ahead(rank)
                    on_engine = True
                    # And only where it fits: a prefill kept local between decode steps
                    # is slower than at a worker, so it is held to the objective, or to
                    # the prompt's prefill time alone where that is longer.
                    alone_ms = self.qos.estimator.estimate_ms(
                        prompt_tokens=prompt_tokens, queued_prefill_tokens=0, decode_running=0
                    )
            elif not self.config.qos:
                return None
        return self.qos.check(
            request.priority,
            prompt_tokens=prompt_tokens,
            queued_prefill_tokens=queued_tokens,
            decode_running=running,
            decode_steps_ahead=steps_ahead,
            alone_ms=alone_ms,
            on_engine=on_engine,
        )

    def _planner_driver(self, config: PlannerConfig, governor: Governor) -> PlannerDriver:
        """The planner, wired to this backend's pool, engine thread and Governor."""
        disagg = self.disagg
        engine = self.engine
        assert disagg is not None
        assert engine is not None
        if config.max_decode_seqs > governor.config.max_inflight:
            # The Governor's slots are the most the decode batch can ever use.
            config = dataclasses.replace(
                config,
                max_decode_seqs=governor.config.max_inflight,
                min_decode_seqs=min(config.min_decode_seqs, governor.config.max_inflight),
            )
        timeout_s = self.config.worker_timeout_s

        def capacity() -> Capacity:
            workers = list(disagg.pool.workers)
            return Capacity(
                prefill_workers=sum(w.active for w in workers),
                prefill_queue=sum(w.queued for w in workers),
                decode_seqs=engine.scheduler.config.max_num_seqs,
                decode_running=len(engine.scheduler.running),
                decode_swapped=engine.scheduler.num_swapped,
            )

        def on_engine(op: str, payload: Any, done: threading.Event) -> None:
            self._inbox.put((op, payload))
            if not done.wait(timeout_s):
                raise RuntimeError(f"the engine thread did not apply {op!r} in time")

        def start_worker() -> None:
            worker = disagg.pool.launch_worker()
            done = threading.Event()
            on_engine("adopt", (worker, done), done)

        def stop_worker() -> None:
            done = threading.Event()
            on_engine("retire", done, done)

        def set_decode_seqs(count: int) -> None:
            done = threading.Event()
            on_engine("decode_seqs", (count, done), done)
            loop = self._loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(governor.set_capacity, count)

        return PlannerDriver(
            Planner(config),
            self._metrics_lock,
            capacity=capacity,
            start_worker=start_worker,
            stop_worker=stop_worker,
            set_decode_seqs=set_decode_seqs,
        )

    def _inbox_put(self, op: str, payload: Any) -> None:
        self._inbox.put((op, payload))

    async def aclose(self) -> None:
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        if self.planner is not None:
            await anyio.to_thread.run_sync(self.planner.close)
        self._inbox.put(("stop", None))
        await anyio.to_thread.run_sync(thread.join)
        self._thread = None
        if self.disagg is not None:
            await anyio.to_thread.run_sync(self.disagg.close)

    # -- requests -------------------------------------------------------------

    def estimate_ms(self, work: Work) -> float | None:
        prompt, sampling = parse_work(work, self.config.default_max_tokens, self.engine)
        engine = self.engine
        if engine is None:
            return None
        # The load as the engine thread last published it (this is the loop's thread).
        load = self._load_now
        return engine.estimate_ms(
            len(prompt),
            sampling.max_tokens,
            steps_ahead=load.steps_ahead,
            decoding=load.running > 0,
            on_engine=load.local_ahead is None,  # no prefill workers
        )

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        if self.engine is None or self._thread is None or self._stopped:
            raise BackendError("the harness engine is not running", retryable=True)
        prompt, sampling = parse_work(work, self.config.default_max_tokens, self.engine)
        degraded = self._degrade(work.priority, sampling)
        if degraded is not None:
            sampling = dataclasses.replace(sampling, max_tokens=degraded["max_tokens"])
        stop = StopText(stop_sequences(work.params))
        request = Request(prompt, sampling, work.priority)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[str] = []
        tokens: list[int] = []
        logprobs: list[dict[str, Any]] = []
        self._tokens_sent[rank_of(work.priority)] += len(prompt)
        self._inbox.put(("add", request))
        try:
            while True:
                await request.wakeup.wait()
                request.wakeup = anyio.Event()
                if request.error is not None:
                    raise BackendError(f"engine failed: {request.error}", retryable=True)
                new, request.pending = request.pending, []
                # One chunk per token, however many arrived since the last wake-up;
                # a token that ends a character in the middle carries no text yet.
                for i, token in enumerate(new):
                    tokens.append(token)
                    last = request.finished and i == len(new) - 1
                    text = stop.feed(decoder.decode(bytes([token]), final=last))
                    if last:
                        text += stop.flush()
                    pieces.append(text)
                    chunk: dict[str, Any] = {"text": text, "token_ids": [token]}
                    if sampling.logprobs is not None:
                        logprobs.append(logprob_entry(request, len(tokens) - 1))
                        chunk["logprobs"] = logprobs[-1:]
                    if last or stop.stopped:
                        chunk["last"] = True
                    if degraded is not None and len(tokens) == 1:
                        chunk["degraded"] = degraded
                    if emit is not None:
                        await emit(chunk)
                    if stop.stopped:
                        break
                if request.finished or stop.stopped:
                    break
        finally:
            if not request.finished:
                self._inbox.put(("abort", request))
        # A byte-level model without an end-of-sequence token runs to max_tokens.
        finish_reason = "stop_sequence" if stop.stopped else "length"
        result = result_of(request, "".join(pieces), tokens, finish_reason)
        if stop.matched is not None:
            result["stop_sequence"] = stop.matched
        if sampling.logprobs is not None:
            result["logprobs"] = logprobs
        if degraded is not None:
            result["degraded"] = degraded
        times = request.token_times
        tpot = result["tpot_ms"] if len(tokens) > 1 else None
        with self._metrics_lock:
            self.metrics.record_request(
                ttft_ms=result["ttft_ms"],
                tpot_ms=tpot,
                itl_ms=[(b - a) * 1000.0 for a, b in itertools.pairwise(times)],
                priority=work.priority,
            )
            if self.planner is not None:
                self.planner.planner.record(
                    time.monotonic(),
                    ttft_ms=result["ttft_ms"],
                    tpot_ms=tpot,
                    prompt_tokens=len(prompt),
                )
        return result

    def _degrade(self, priority: Priority, sampling: SamplingParams) -> dict[str, Any] | None:
        """The reduced output length this request gets under sustained overload, if any."""
        degrader = self.degrader
        if degrader is None:
            return None
        verdict = degrader.cap(priority, time.monotonic())
        if verdict.max_tokens is None or verdict.max_tokens >= sampling.max_tokens:
            return None
        degrader.record(verdict)
        return {
            "max_tokens": verdict.max_tokens,
            "requested_max_tokens": sampling.max_tokens,
            "level": verdict.level,
            "reason": "overload",
        }

    def stats(self) -> dict[str, Any]:
        """The engine's counters (for the server's ``stats``)."""
        if self.engine is None:
            return {"state": "loading"}
        stats = self.engine.stats()
        if self.disagg is not None:
            stats.update(self.disagg.stats())
        with self._metrics_lock:
            stats["serving"] = self.metrics.snapshot()
        if self.qos is not None:
            stats["qos"] = self.qos.stats()
        if self.degrader is not None:
            stats["degrade"] = self.degrader.stats(time.monotonic())
        if self.planner is not None:
            stats["planner"] = self.planner.stats()
        return stats


def _chain(first: AdmissionHook | None, second: AdmissionHook) -> AdmissionHook:
    """An admission hook that asks ``first`` (if any), then ``second``."""
    if first is None:
        return second

    def both(request: AdmissionRequest) -> Rejection | None:
        return first(request) or second(request)

    return both

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
default, is greedy) and ``seed``. Streams get one chunk per step that adds
text: ``{"text": ..., "token_ids": [...]}``. The result: ``text``,
``prompt_tokens``, ``completion_tokens``, ``cached_tokens`` (prompt tokens
found in the prefix cache), ``ttft_ms``, ``tpot_ms``, ``e2e_ms``,
``preemptions`` and ``finish_reason``.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch

from yieldgate.harness.engine import Engine, EngineConfig, StepResult
from yieldgate.harness.sequence import SamplingParams, Sequence
from yieldgate.server.backends import BackendError, Emit, Work
from yieldgate.server.governor import Governor

__all__ = ["HarnessBackend", "HarnessConfig"]

log = logging.getLogger("yieldgate.harness")

# A warm-up prompt long enough to exercise a multi-block prefill.
_WARMUP_PROMPT = list(b"yieldgate warm-up: " * 8)
_WARMUP_TOKENS = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class HarnessConfig:
    """The engine plus what the backend adds around it.

    ``expected_load_s`` is the cold-start estimate clients are told while the
    model loads and warms up (the default model takes about 0.25 s on one CPU
    thread); ``torch_threads`` is set for the whole process.
    """

    engine: EngineConfig = field(default_factory=EngineConfig)
    default_max_tokens: int = 16
    torch_threads: int = 1
    expected_load_s: float = 0.5

    def __post_init__(self) -> None:
        if self.default_max_tokens < 1:
            raise ValueError("default_max_tokens must be >= 1")
        if self.torch_threads < 1:
            raise ValueError("torch_threads must be >= 1")
        if not (self.expected_load_s >= 0 and math.isfinite(self.expected_load_s)):
            raise ValueError("expected_load_s must be a finite number >= 0")


class _Request:
    """One submit's state, shared between the event loop and the engine thread."""

    __slots__ = (
        "error",
        "finished",
        "first_token_at",
        "last_token_at",
        "pending",
        "prompt",
        "sampling",
        "seq",
        "started_at",
        "wakeup",
    )

    def __init__(self, prompt: list[int], sampling: SamplingParams) -> None:
        self.prompt = prompt
        self.sampling = sampling
        self.seq: Sequence | None = None  # set by the engine thread
        self.started_at = time.monotonic()
        self.first_token_at: float | None = None
        self.last_token_at = 0.0
        self.pending: list[int] = []
        self.finished = False
        self.error: BaseException | None = None
        self.wakeup = anyio.Event()


class HarnessBackend:
    """Serves ``TinyTransformer`` with continuous batching behind the Governor."""

    name = "harness"

    def __init__(self, config: HarnessConfig | None = None) -> None:
        self.config = config or HarnessConfig()
        self.engine: Engine | None = None
        self._inbox: queue.SimpleQueue[tuple[str, _Request | None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._live: dict[int, _Request] = {}  # engine thread only
        self._closed = False

    # -- lifecycle ------------------------------------------------------------

    async def start(self, governor: Governor) -> None:
        governor.begin_cold_start(self.config.expected_load_s)
        # Admit no more than the engine runs at once: anything beyond would wait
        # in the engine's queue, the very buffering the Governor exists to refuse.
        max_num_seqs = self.config.engine.scheduler.max_num_seqs
        if governor.config.max_inflight > max_num_seqs:
            governor.set_capacity(max_num_seqs)
        self._loop = asyncio.get_running_loop()
        # Per process, and the engine thread's kernels are the only torch work here.
        torch.set_num_threads(self.config.torch_threads)
        started = time.monotonic()
        self.engine = await anyio.to_thread.run_sync(self._load)
        if self._closed:
            return
        self._thread = threading.Thread(target=self._run, name="yieldgate-engine", daemon=True)
        self._thread.start()
        log.info(
            "harness engine on %s ready in %.2fs", self.engine.device, time.monotonic() - started
        )
        governor.mark_warm()

    def _load(self) -> Engine:
        engine = Engine(self.config.engine)
        # Warm-up: the first kernels are slow to start, and the Governor's
        # hints need a measured prefill and decode speed from the first request on.
        engine.generate([_WARMUP_PROMPT], SamplingParams(max_tokens=_WARMUP_TOKENS))
        engine.reset_counters()
        return engine

    async def aclose(self) -> None:
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        self._inbox.put(("stop", None))
        await anyio.to_thread.run_sync(thread.join)
        self._thread = None

    # -- requests -------------------------------------------------------------

    def _parse(self, work: Work) -> tuple[list[int], SamplingParams]:
        params = work.params
        max_tokens = params.get("max_tokens", self.config.default_max_tokens)
        if max_tokens is None:
            max_tokens = self.config.default_max_tokens
        if type(max_tokens) is not int or max_tokens < 1:
            raise BackendError("params.max_tokens must be an integer >= 1", retryable=False)
        temperature = params.get("temperature", 0.0)
        if temperature is None:
            temperature = 0.0
        if (
            isinstance(temperature, bool)
            or not isinstance(temperature, int | float)
            or not (temperature >= 0 and math.isfinite(temperature))
        ):
            raise BackendError("params.temperature must be a number >= 0", retryable=False)
        seed = params.get("seed")
        if seed is not None and (type(seed) is not int or not 0 <= seed < 2**63):
            raise BackendError("params.seed must be an integer in [0, 2**63)", retryable=False)
        prompt = list(work.body.encode("utf-8"))
        if not prompt:
            raise BackendError("the prompt (the request body) is empty", retryable=False)
        sampling = SamplingParams(max_tokens=max_tokens, temperature=float(temperature), seed=seed)
        engine = self.engine
        if engine is not None:
            try:
                engine.check(len(prompt), sampling)
            except ValueError as exc:
                raise BackendError(str(exc), retryable=False) from None
        return prompt, sampling

    def estimate_ms(self, work: Work) -> float | None:
        prompt, sampling = self._parse(work)
        engine = self.engine
        if engine is None:
            return None
        return engine.estimate_ms(len(prompt), sampling.max_tokens)

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        if self.engine is None or self._thread is None:
            raise BackendError("the harness engine is not running", retryable=True)
        prompt, sampling = self._parse(work)
        request = _Request(prompt, sampling)
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[str] = []
        tokens: list[int] = []
        self._inbox.put(("add", request))
        try:
            while True:
                await request.wakeup.wait()
                request.wakeup = anyio.Event()
                if request.error is not None:
                    raise BackendError(f"engine failed: {request.error}", retryable=True)
                new, request.pending = request.pending, []
                tokens.extend(new)
                text = decoder.decode(bytes(new), final=request.finished)
                if text:
                    pieces.append(text)
                    if emit is not None:
                        await emit({"text": text, "token_ids": new})
                if request.finished:
                    break
        finally:
            if not request.finished:
                self._inbox.put(("abort", request))
        return self._result(request, "".join(pieces), tokens)

    def _result(self, request: _Request, text: str, tokens: list[int]) -> dict[str, Any]:
        seq = request.seq
        assert seq is not None
        assert request.first_token_at is not None
        ttft_ms = (request.first_token_at - request.started_at) * 1000.0
        e2e_ms = (request.last_token_at - request.started_at) * 1000.0
        tpot_ms = (e2e_ms - ttft_ms) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
        return {
            "text": text,
            "prompt_tokens": len(request.prompt),
            "completion_tokens": len(tokens),
            "cached_tokens": seq.prefix_hit_tokens,
            "ttft_ms": round(ttft_ms, 3),
            "tpot_ms": round(tpot_ms, 3),
            "e2e_ms": round(e2e_ms, 3),
            "preemptions": seq.num_preemptions,
            "finish_reason": "length",
        }

    def stats(self) -> dict[str, Any]:
        """The engine's counters (for the server's ``stats``)."""
        if self.engine is None:
            return {"state": "loading"}
        return self.engine.stats()

    # -- the engine thread ----------------------------------------------------

    def _run(self) -> None:
        engine = self.engine
        assert engine is not None
        while True:
            # Block for new requests only when nothing is running.
            if not self._drain(block=not engine.has_work):
                break
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
            self._publish(result)
        stopped = RuntimeError("the engine stopped")
        self._post([(request, None, False) for request in self._live.values()], error=stopped)
        self._live.clear()

    def _drain(self, *, block: bool) -> bool:
        """Apply queued adds and aborts; ``False`` once asked to stop."""
        engine = self.engine
        assert engine is not None
        try:
            item = self._inbox.get() if block else self._inbox.get_nowait()
        except queue.Empty:
            return True
        while True:
            op, request = item
            if op == "stop":
                return False
            assert request is not None
            if op == "add":
                try:
                    request.seq = seq = engine.add(request.prompt, request.sampling)
                except ValueError as exc:
                    self._post([(request, None, False)], error=exc)
                else:
                    self._live[seq.id] = request
            elif request.seq is not None and self._live.pop(request.seq.id, None) is not None:
                engine.abort(request.seq)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True

    def _publish(self, result: StepResult) -> None:
        now = time.monotonic()
        finished = {seq.id for seq in result.finished}
        events: list[tuple[_Request, int | None, bool]] = []
        for seq, token in zip(result.seqs, result.tokens, strict=True):
            request = self._live.get(seq.id)
            if request is not None:
                events.append((request, token, seq.id in finished))
        for seq_id in finished:
            self._live.pop(seq_id, None)
        self._post(events, now)

    def _post(
        self,
        events: list[tuple[_Request, int | None, bool]],
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
        events: list[tuple[_Request, int | None, bool]], now: float, error: BaseException | None
    ) -> None:
        for request, token, finished in events:
            if error is not None:
                request.error = error
            if token is not None:
                if request.first_token_at is None:
                    request.first_token_at = now
                request.last_token_at = now
                request.pending.append(token)
            request.finished = request.finished or finished
            request.wakeup.set()

    def _fail_all(self, engine: Engine, exc: BaseException) -> None:
        failed = list(self._live.values())
        for request in failed:
            if request.seq is not None:
                engine.abort(request.seq)
        self._live.clear()
        self._post([(request, None, False) for request in failed], error=exc)

"""Backends: what executes admitted work, behind the Governor.

A backend implements ``Backend``: ``start`` (warm up; may hold the Governor
cold and ramp its capacity), ``execute`` (run one admitted submit, optionally
streaming pieces through ``emit``) and ``aclose``. The fronts own admission,
deadlines and cancellation; a backend only has to be cancellable.

``SimulatedBackend`` (``--backend sleep``) stands in for a model: execution
times fixed or drawn from a weighted mix, a failure rate, a cold-start period
and a capacity ramp, all drawn from one seeded generator so runs repeat.

Both backends honour ``params["stop"]`` (stop sequences) with ``StopText``
and ``params["max_tokens"]``, and say why a generation ended in their
result's ``finish_reason``: ``"length"`` (``max_tokens`` reached),
``"stop_sequence"`` or ``"eos"`` (the model's own end, also what an absent
one means: the simulated echo ends so, and says nothing unless a stop
sequence or ``max_tokens`` cut it); a stop sequence that ended it is named
in ``stop_sequence``.

Tokens: both backends are byte-level, a token is one byte of the text's
UTF-8 (``yieldgate tokenizer`` writes that tokenizer out for other tools).
Their results count ``prompt_tokens`` and ``completion_tokens`` so; the
harness also sends the ids (``prompt_token_ids``, ``token_ids``: the bytes),
the echo leaves them out (they would quadruple a large echo's reply) and the
HTTP dialects derive them from the text. A stream's last chunk carries
``"last": true`` (TGI's last event carries the last token).

Optional params (``FEATURES``: ``logprobs``, ``top_p``) are honoured only
by a backend that names them in a ``features`` attribute (a frozenset; the
harness does); ``features_of`` reads it, with none for a backend that
declares nothing (the simulated one), and the HTTP fronts refuse such a
param with a 400 naming it rather than let it be ignored.
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import anyio

from yieldgate.protocol import Priority
from yieldgate.server.governor import Governor

__all__ = [
    "FEATURES",
    "Backend",
    "BackendError",
    "Emit",
    "SimulatedBackend",
    "SimulatedConfig",
    "StopText",
    "Work",
    "features_of",
    "parse_mix",
    "stop_sequences",
]

_MAX_STOPS = 4

# The optional params: a backend honours one only where its ``features`` name it.
FEATURES = frozenset({"logprobs", "top_p"})

Emit = Callable[[Any], Awaitable[None]]


class BackendError(Exception):
    """Raised by a backend for a failure it wants reported as ``backend_error``.

    ``retryable`` is sent to the client as is. Any other exception a backend
    raises is also reported as ``backend_error``, with ``retryable`` false.
    """

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.message = message
        """What failed, sent to the client as the error's ``message``."""
        self.retryable = retryable
        """Sent to the client as is: whether a resend may succeed (default: true)."""


@dataclass(slots=True, kw_only=True)
class Work:
    """One submit, as a backend sees it (built per submit: slotted, treat as read-only)."""

    id: str
    """The submit's ``id``, unique among the connection's submits in flight."""
    body: str
    """The submit's body: the prompt."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """The submit's backend parameters (``max_tokens``, ``stop``, ``exec_ms``...)."""
    priority: Priority = Priority.NORMAL
    """The submit's priority."""
    stream: bool = False
    """Whether the client asked for ``chunk`` replies (``execute`` then gets ``emit``)."""


class Backend(Protocol):
    """What the server needs from a backend."""

    name: str
    """A short name for the backend, in logs and metrics (``sleep``, ``harness``)."""

    async def start(self, governor: Governor) -> None:
        """Warm up. Runs beside the fronts, which already answer (``cold_start``)."""
        ...

    def estimate_ms(self, work: Work) -> float | None:
        """Check ``work`` before admission and estimate its duration in ms.

        Called before a slot is taken: raise ``BackendError`` for parameters
        the backend cannot accept, so a bad request costs no slot and skews no
        measurement. Return the expected duration for the Governor's hints,
        or ``None`` to use its measured average.
        """
        ...

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        """Run ``work`` and return a JSON-serialisable result.

        When the client asked for a stream, ``emit`` is given: each call sends
        one ``chunk`` (JSON-serialisable data) before the terminal reply.
        """
        ...

    async def aclose(self) -> None:
        """Release what the backend holds (threads, a model), once the fronts have stopped."""
        ...


def stop_sequences(params: Mapping[str, Any]) -> tuple[str, ...]:
    """``params["stop"]``: at most four non-empty strings (``BackendError`` otherwise)."""
    stop = params.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (
        not isinstance(stop, list | tuple)
        or len(stop) > _MAX_STOPS
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise BackendError(
            f"params.stop must be a non-empty string or at most {_MAX_STOPS} of them",
            retryable=False,
        )
    return tuple(stop)


def _max_tokens(params: Mapping[str, Any]) -> int | None:
    """``params["max_tokens"]``: an integer >= 1, or ``None`` (``BackendError`` otherwise)."""
    max_tokens = params.get("max_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise BackendError("params.max_tokens must be an integer >= 1", retryable=False)
    return max_tokens


def _utf8_prefix(text: str, max_bytes: int) -> str:
    """The longest start of ``text`` whose UTF-8 is at most ``max_bytes`` long (whole characters).

    Lone surrogates count as the three bytes ``surrogatepass`` writes.
    """
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= max_bytes:
        return text
    end = max_bytes
    while end > 0 and raw[end] & 0xC0 == 0x80:  # a continuation byte: inside a character
        end -= 1
    return raw[:end].decode("utf-8", "surrogatepass")


class StopText:
    """Cuts generated text before the first of ``stops``, fed piece by piece.

    ``feed`` returns the text now safe to send: a tail that could be the
    start of a stop sequence is held back until the next piece settles it.
    Once a stop sequence is found, ``stopped`` is true, ``matched`` is that
    sequence (the one that starts first; of two starting there, the first
    given) and nothing more is returned; ``flush`` releases what is held back
    when the text ends.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self.stopped = False
        self.matched: str | None = None
        self._held = ""

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        text = self._held + text
        found = [(i, stop) for stop in self.stops if (i := text.find(stop)) >= 0]
        if found:
            self.stopped = True
            self._held = ""
            start, self.matched = min(found, key=lambda hit: hit[0])
            return text[:start]
        hold = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), hold, -1):
                if stop.startswith(text[-n:]):
                    hold = n
                    break
        self._held = text[len(text) - hold :]
        return text[: len(text) - hold]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held


def parse_mix(spec: str) -> tuple[tuple[float, float], ...]:
    """Parse an execution-time mix such as ``"300:0.8,3000:0.2"`` (ms:weight, ...)."""
    mix: list[tuple[float, float]] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        ms_text, sep, weight_text = part.partition(":")
        try:
            ms = float(ms_text)
            weight = float(weight_text) if sep else 1.0
        except ValueError:
            raise ValueError(f"bad mix entry {part!r}: expected MS:WEIGHT") from None
        mix.append((ms, weight))
    if not mix:
        raise ValueError(f"empty execution-time mix {spec!r}")
    return tuple(mix)


@dataclass(frozen=True, slots=True, kw_only=True)
class SimulatedConfig:
    """A simulated model.

    ``mix`` (``(ms, weight)`` pairs) overrides ``exec_ms`` when given. During
    ``cold_start_s`` after start every submit is yielded ``cold_start``; then
    capacity ramps linearly from 1 to ``max_inflight`` over ``ramp_s``.
    ``fail_rate`` of executions raise a retryable ``BackendError`` at their end.
    """

    exec_ms: float = 500.0
    """How long each execution sleeps, in ms (default: 500)."""
    mix: Sequence[tuple[float, float]] = ()
    """``(ms, weight)`` pairs to draw each duration from; overrides ``exec_ms`` when given."""
    fail_rate: float = 0.0
    """The share of executions that raise a retryable ``BackendError`` (default: 0)."""
    cold_start_s: float = 0.0
    """Seconds after start during which every submit yields ``cold_start``."""
    ramp_s: float = 0.0
    """Seconds over which capacity then ramps from 1 to ``max_inflight`` (0: none)."""
    stream_chunks: int = 4
    """How many chunks a stream is cut into, unless ``params`` say (default: 4)."""
    seed: int = 0
    """Seeds the draws (durations, failures), so that a run repeats."""
    max_param_exec_ms: float = 600_000.0
    """The longest ``exec_ms`` a request's ``params`` may ask for, in ms."""

    def __post_init__(self) -> None:
        if not (self.exec_ms >= 0 and math.isfinite(self.exec_ms)):
            raise ValueError("exec_ms must be a finite number >= 0")
        for ms, weight in self.mix:
            if not (ms >= 0 and math.isfinite(ms)) or not (weight > 0 and math.isfinite(weight)):
                raise ValueError(f"bad mix entry ({ms}, {weight}): need ms >= 0 and weight > 0")
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must be in [0, 1]")
        if not (self.cold_start_s >= 0 and math.isfinite(self.cold_start_s)):
            raise ValueError("cold_start_s must be a finite number >= 0")
        if not (self.ramp_s >= 0 and math.isfinite(self.ramp_s)):
            raise ValueError("ramp_s must be a finite number >= 0")
        if self.stream_chunks < 1:
            raise ValueError("stream_chunks must be >= 1")


class SimulatedBackend:
    """Sleeps instead of computing; echoes the body, as a byte-level model would generate it.

    The answer is ``{"text": ..., "prompt_tokens": ..., "completion_tokens": ...}``:
    the body cut to ``params["max_tokens"]`` bytes (whole characters;
    ``finish_reason`` ``"length"``), then before a stop sequence
    (``"stop_sequence"``, named in ``stop_sequence``); the counts are UTF-8
    bytes of the body and of the text returned.

    Per-request ``params`` steer it in tests and demos: ``exec_ms`` (a number
    in ``[0, max_param_exec_ms]``) replaces the drawn duration, ``fail`` (true)
    forces a failure and ``chunks`` (an integer in ``[1, 10000]``) sets how
    many pieces a stream is cut into: equal runs of characters at even
    intervals, an empty one (a text shorter than ``chunks``) not sent. Bad
    values are refused before admission.
    """

    name = "sleep"
    """``sleep``: it sleeps instead of computing."""

    def __init__(self, config: SimulatedConfig | None = None) -> None:
        self.config = config or SimulatedConfig()
        """The simulated model's timings, failures and warm-up."""
        # One seeded generator for every draw, so a run with the same arrivals repeats.
        self._rng = random.Random(self.config.seed)  # noqa: S311 - simulation, not security
        self._durations = [ms for ms, _ in self.config.mix]
        self._weights = [w for _, w in self.config.mix]

    async def start(self, governor: Governor) -> None:
        """Yield ``cold_start`` for ``cold_start_s``, then ramp capacity over ``ramp_s``."""
        cfg = self.config
        if cfg.cold_start_s > 0:
            governor.begin_cold_start(cfg.cold_start_s)
            await anyio.sleep(cfg.cold_start_s)
        if cfg.ramp_s > 0 and governor.config.max_inflight > 1:
            top = governor.config.max_inflight
            governor.set_capacity(1)
            governor.mark_warm()
            step = cfg.ramp_s / (top - 1)
            for capacity in range(2, top + 1):
                await anyio.sleep(step)
                governor.set_capacity(capacity)
        governor.mark_warm()

    def _override_ms(self, work: Work) -> float | None:
        override = work.params.get("exec_ms")
        if override is None:
            return None
        limit = self.config.max_param_exec_ms
        if (
            isinstance(override, bool)
            or not isinstance(override, int | float)
            or not 0 <= override <= limit
        ):
            raise BackendError(f"params.exec_ms must be a number in [0, {limit}]", retryable=False)
        return float(override)

    def _chunks(self, work: Work) -> int:
        chunks = work.params.get("chunks", self.config.stream_chunks)
        if type(chunks) is not int or not 1 <= chunks <= 10_000:
            raise BackendError("params.chunks must be an integer in [1, 10000]", retryable=False)
        return chunks

    def estimate_ms(self, work: Work) -> float | None:
        """Check ``params`` (``BackendError``, before admission); their ``exec_ms`` or ``None``."""
        stop_sequences(work.params)
        _max_tokens(work.params)
        if work.stream:
            self._chunks(work)
        return self._override_ms(work)

    def _duration_ms(self, work: Work) -> float:
        override = self._override_ms(work)
        if override is not None:
            return override
        if self.config.mix:
            return self._rng.choices(self._durations, self._weights)[0]
        return self.config.exec_ms

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        """Sleep for the drawn duration (streaming the echo through ``emit``), then answer."""
        duration_s = self._duration_ms(work) / 1000.0
        fails = work.params.get("fail") is True or (
            self.config.fail_rate > 0 and self._rng.random() < self.config.fail_rate
        )
        text, finish_reason, matched = _echo(work)
        if emit is None:
            await anyio.sleep(duration_s)
        else:
            chunks = self._chunks(work)
            pieces = _split(text, chunks)
            for n, piece in enumerate(pieces, 1):
                await anyio.sleep(duration_s / chunks)
                if piece:
                    await emit({"text": piece, "last": True} if n == chunks else {"text": piece})
        if fails:
            raise BackendError("simulated backend failure", retryable=True)
        result: dict[str, Any] = {
            "text": text,
            "prompt_tokens": len(work.body.encode("utf-8", "surrogatepass")),
            "completion_tokens": len(text.encode("utf-8", "surrogatepass")),
        }
        if finish_reason is not None:
            # None: the echo ended by itself ("eos"), what an absent one means.
            result["finish_reason"] = finish_reason
        if matched is not None:
            result["stop_sequence"] = matched
        return result

    async def aclose(self) -> None:
        """Nothing to release."""
        return None


def _echo(work: Work) -> tuple[str, str | None, str | None]:
    """The echo generated for ``work``, why it ended early (``None``: it did not) and the
    stop sequence that ended it, if one did."""
    text = work.body
    finish_reason = None
    max_tokens = _max_tokens(work.params)
    if max_tokens is not None:
        cut = _utf8_prefix(text, max_tokens)
        if len(cut) < len(text):
            text, finish_reason = cut, "length"
    stop = StopText(stop_sequences(work.params))
    text = stop.feed(text) + stop.flush()
    if stop.stopped:
        return text, "stop_sequence", stop.matched
    return text, finish_reason, None


def _split(text: str, parts: int) -> list[str]:
    """Cut ``text`` into ``parts`` consecutive pieces (some empty if it is short)."""
    size, extra = divmod(len(text), parts)
    pieces = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        pieces.append(text[start:end])
        start = end
    return pieces


def features_of(backend: object) -> frozenset[str]:
    """The optional params (of ``FEATURES``) that ``backend`` declares it honours.

    A plain attribute rather than a ``Backend`` protocol member, so that a
    backend written before it (or one that honours none) needs no change.
    """
    declared: frozenset[str] = getattr(backend, "features", frozenset())
    return FEATURES & frozenset(declared)

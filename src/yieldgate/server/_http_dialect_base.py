"""What every HTTP dialect is made of: the JSON codec, field readers, the ``Job`` and ``Dialect``.

``BadRequest`` is what a dialect raises for a body or header it cannot
accept; ``loads``, ``dumps`` and ``sse`` read and write the JSON; the
``*_field`` readers check one field each, naming it in the error; a backend
result is read into a ``Generated`` by ``generated``, a stream chunk by
``chunk_text``, ``chunk_token_ids`` and ``chunk_is_last``.

Tokens: the served model's tokenizer is byte-level (``yieldgate tokenizer``
writes it out): a token is one byte of the text's UTF-8 and its id is the
byte's value, for both backends. A backend's own counts and ids are sent
as they are (the harness counts the tokens it generated, a cut stop
sequence's too); where it sends none, they are the bytes of the prompt and
of the text returned (``text_token_ids``), so they agree with the tokenizer.
``Dialect`` is the interface each route family implements over a parsed
``Job``. Pure functions of JSON values: no I/O, no starlette.
"""

from __future__ import annotations

import codecs
import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from yieldgate.server._http_logprobs import TokenLogprob
from yieldgate.server._http_responses import Family
from yieldgate.server.backends import BackendError
from yieldgate.server.governor import Yield

__all__ = [
    "BadRequest",
    "Dialect",
    "Generated",
    "Job",
    "backend_params",
    "bool_field",
    "chunk_is_last",
    "chunk_text",
    "chunk_token_ids",
    "dumps",
    "generated",
    "int_field",
    "loads",
    "number_field",
    "object_field",
    "refuse_unsupported",
    "retry_after_s",
    "seed_field",
    "sse",
    "stop_field",
    "text_token_ids",
    "tokens_of",
    "top_p_field",
]

_MAX_STOPS = 4
_FINISH_REASONS = frozenset({"length", "stop_sequence", "eos"})


class BadRequest(Exception):
    """A request body or header this dialect cannot accept (400, or 422 for TGI).

    ``param`` names the field at fault, for the dialects whose errors say so.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every body: json.loads builds a new one per call when given parse_constant.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or ``BadRequest``."""
    try:
        # As json.loads reads bytes: UTF-8, -16 or -32, as detected.
        body = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except RecursionError:
        raise BadRequest("request body is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN
        raise BadRequest(f"request body is not valid JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


def dumps(obj: Any) -> bytes:
    """Compact ASCII JSON (lone surrogates escaped, NaN refused with ``ValueError``)."""
    return json.dumps(obj, separators=(",", ":"), allow_nan=False).encode("ascii")


def sse(obj: Any) -> bytes:
    """One server-sent event carrying ``obj`` as its data."""
    return b"data: " + dumps(obj) + b"\n\n"


def retry_after_s(hint_ms: int) -> int:
    """``retry-after`` in whole seconds: never earlier than the hint."""
    return math.ceil(hint_ms / 1000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Generated:
    """A backend's finished generation, as the dialects answer it.

    ``finish_reason`` is ``"length"`` (the length limit ended it),
    ``"stop_sequence"`` or ``"eos"`` (it ended by itself), and
    ``stop_sequence`` the sequence that ended it where the backend says; the
    token ids are the backend's own, ``None`` where it has no vocabulary.
    """

    text: str
    usage: dict[str, int]
    finish_reason: str
    token_ids: tuple[int, ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    # One per token where the backend computed them (``_http_logprobs``).
    logprobs: tuple[TokenLogprob, ...] | None = None
    stop_sequence: str | None = None


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list | tuple) and all(type(i) is int for i in value):
        return tuple(value)
    return None


def generated(job: Job, result: Any) -> Generated:
    """A backend result read: ``{"text": str}`` with optional integer token
    counts, ``token_ids``, ``prompt_token_ids``, ``finish_reason`` and
    ``stop_sequence`` (a bare string is accepted as the text). Anything else
    is the backend's fault.
    """
    if isinstance(result, str):
        result = {"text": result}
    if not isinstance(result, Mapping) or not isinstance(result.get("text"), str):
        raise BackendError("backend result has no 'text' string", retryable=False)
    text: str = result["text"]
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = result.get(key)
        counts.append(value if type(value) is int and value >= 0 else None)
    prompt = _num_bytes(job.prompt) if counts[0] is None else counts[0]
    completion = _num_bytes(text) if counts[1] is None else counts[1]
    reason = result.get("finish_reason")
    matched = result.get("stop_sequence")
    return Generated(
        text=text,
        usage={
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
        finish_reason=reason if reason in _FINISH_REASONS else "eos",
        token_ids=_ids(result.get("token_ids")),
        prompt_token_ids=_ids(result.get("prompt_token_ids")),
        stop_sequence=matched if reason == "stop_sequence" and isinstance(matched, str) else None,
    )


def chunk_text(data: Any) -> str:
    """The text of one streamed chunk (``{"text": str}``)."""
    if isinstance(data, Mapping) and isinstance(data.get("text"), str):
        text: str = data["text"]
        return text
    raise BackendError("backend stream chunk has no 'text' string", retryable=False)


def chunk_token_ids(data: Any) -> tuple[int, ...] | None:
    """The token ids of one streamed chunk, where the backend sends them."""
    return _ids(data.get("token_ids")) if isinstance(data, Mapping) else None


def chunk_is_last(data: Any) -> bool:
    """Whether the backend marked this chunk its stream's last (``"last": true``)."""
    return isinstance(data, Mapping) and data.get("last") is True


def text_token_ids(text: str) -> tuple[int, ...]:
    """The ids of ``text``'s tokens: its UTF-8 bytes (a lone surrogate as ``surrogatepass``
    writes it)."""
    return tuple(text.encode("utf-8", "surrogatepass"))


def tokens_of(text: str, token_ids: tuple[int, ...] | None) -> list[tuple[int, str]]:
    """``(id, text)`` per token: the ids (``text``'s own where ``None``) decoded one by one,
    a token's text empty while a character is incomplete."""
    if token_ids is None:
        token_ids = text_token_ids(text)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    last = len(token_ids) - 1
    return [
        (i, decoder.decode(bytes([i & 0xFF]), final=n == last)) for n, i in enumerate(token_ids)
    ]


def _num_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


# -- reading fields -------------------------------------------------------------


def object_field(body: Mapping[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}{key}' must be an object", f"{where}{key}")
    return value


def int_field(body: Mapping[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadRequest(f"'{where}{key}' must be a positive integer", f"{where}{key}")
    return value


def seed_field(body: Mapping[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < 2**63:
        raise BadRequest(f"'{where}{key}' must be an integer in [0, 2**63)", f"{where}{key}")
    return value


def number_field(body: Mapping[str, Any], key: str, where: str = "") -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"'{where}{key}' must be a number", f"{where}{key}")
    return value


def bool_field(body: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{where}{key}' must be a boolean", f"{where}{key}")
    return value


def stop_field(body: Mapping[str, Any], key: str, where: str = "") -> list[str] | None:
    """Stop sequences: a non-empty string or an array of at most four."""
    value = body.get(key)
    if value is None:
        return None
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or len(stops) > _MAX_STOPS
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise BadRequest(
            f"'{where}{key}' must be a non-empty string or an array of at most "
            f"{_MAX_STOPS} of them",
            f"{where}{key}",
        )
    return stops or None


def refuse_unsupported(
    body: Mapping[str, Any], unsupported: tuple[tuple[str, tuple[Any, ...]], ...], where: str = ""
) -> None:
    """``BadRequest`` naming the first of the ``unsupported`` fields that asks for something.

    Each field comes with its neutral values, those that ask for nothing (what
    some clients send by default); ``null`` is an absent field.
    """
    for key, neutral in unsupported:
        value = body.get(key)
        if value is not None and not any(_same(value, n) for n in neutral):
            raise BadRequest(f"'{where}{key}' is not supported by this server", f"{where}{key}")


def _same(value: Any, neutral: Any) -> bool:
    if type(value) is type(neutral):
        return bool(value == neutral)
    numbers = (int, float)
    return type(value) in numbers and type(neutral) in numbers and value == neutral


def backend_params(
    max_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    extra: Mapping[str, Any],
    stop: list[str] | None = None,
) -> dict[str, Any]:
    params: dict[str, Any] = {}
    if stop is not None:
        params["stop"] = stop
    if max_tokens is not None:
        params["max_tokens"] = max_tokens
    if temperature is not None:
        params["temperature"] = temperature
    if seed is not None:
        params["seed"] = seed
    params.update(extra)
    return params


# -- the dialect interface --------------------------------------------------------


@dataclass(slots=True, kw_only=True)
class Job:
    """One parsed request: what the backend gets and what the response echoes."""

    prompt: str
    params: dict[str, Any]
    stream: bool
    model: str
    include_usage: bool = False
    details: bool = False
    prefill_details: bool = False
    return_full_text: bool = False
    # Ask the backend for each token's log-probability if it can give them (TGI's
    # tokens carry one); a backend without the feature answers without them.
    logprobs_where_honoured: bool = False
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""
    # Characters of text streamed so far (where a dialect counts them: text offsets).
    sent_chars: int = 0
    # Tokens generated for it so far (the route counts them; the quota settles by them).
    output_tokens: int = 0


class Dialect:
    """One route family's request format, bodies, errors and yields."""

    family: ClassVar[Family]
    invalid_status: ClassVar[int] = 400
    #: The status of a yield (Anthropic answers overload with 529).
    yield_status: ClassVar[int] = 429
    id_prefix: ClassVar[str] = ""

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        raise NotImplementedError

    def new_id(self) -> str:
        return f"{self.id_prefix}{uuid.uuid4().hex[:24]}"

    def ok(self, job: Job, done: Generated) -> Any:
        raise NotImplementedError

    def piece(self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None) -> bytes:
        """The event for the ``index``-th streamed piece (one token where the backend streams
        tokens)."""
        raise NotImplementedError

    def end(self, job: Job, index: int, done: Generated) -> bytes:
        """The events that end a stream of ``index`` pieces."""
        raise NotImplementedError

    #: Whether the event that ends a stream carries its last piece (TGI's does): a chunk
    #: the backend marks last is then held back for ``end_with``.
    last_piece_ends: ClassVar[bool] = False

    def end_with(
        self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None, done: Generated
    ) -> bytes:
        """The events that end a stream with its ``index``-th piece, held back for them."""
        raise NotImplementedError

    def error(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return sse(self.error(status, code, message))

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        """The dialect's own error fields for a 429 yield."""
        raise NotImplementedError

    def cold_start(self, job: Job, refusal: Yield) -> dict[str, Any] | None:
        """A 503 body that replaces the 429 while the backend is cold, if this dialect has one."""
        return None

    def piece_of(self, job: Job, index: int, data: Any) -> bytes:
        """The event for the backend's ``index``-th stream chunk: ``piece`` of its text and
        ids, unless a dialect reads more of it (OpenAI's log-probabilities)."""
        return self.piece(job, index, chunk_text(data), chunk_token_ids(data))


def top_p_field(body: Mapping[str, Any], where: str = "") -> float | None:
    """``top_p`` below 1, or ``None`` (1 asks for nothing); honoured by a backend with
    the ``top_p`` feature, refused with a 400 by the others."""
    value = number_field(body, "top_p", where)
    if value is None or value == 1:
        return None
    if not 0 < value < 1:
        raise BadRequest(f"'{where}top_p' must be a number in (0, 1]", f"{where}top_p")
    return value

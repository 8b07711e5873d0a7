"""What every HTTP dialect is made of: the JSON codec, field readers, the ``Job`` and ``Dialect``.

``BadRequest`` is what a dialect raises for a body or header it cannot
accept; ``loads``, ``dumps`` and ``sse`` read and write the JSON; the
``*_field`` readers check one field each, naming it in the error; a backend
result or stream chunk is read by ``result_text`` and ``chunk_text``.
``Dialect`` is the interface each route family implements over a parsed
``Job``. Pure functions of JSON values: no I/O, no starlette.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from yieldgate.server.backends import BackendError
from yieldgate.server.governor import Yield

__all__ = [
    "BadRequest",
    "Dialect",
    "Job",
    "backend_params",
    "bool_field",
    "chunk_text",
    "dumps",
    "int_field",
    "loads",
    "number_field",
    "object_field",
    "result_text",
    "retry_after_s",
    "seed_field",
    "sse",
    "usage_of",
]


class BadRequest(Exception):
    """A request body or header this dialect cannot accept (400, or 422 for TGI)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or ``BadRequest``."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
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


def result_text(result: Any) -> tuple[str, int | None, int | None]:
    """``(text, prompt_tokens, completion_tokens)`` from a backend result.

    A result is ``{"text": str}`` with optional integer token counts (a bare
    string is accepted as the text). Anything else is the backend's fault.
    """
    if isinstance(result, str):
        return result, None, None
    if not isinstance(result, Mapping) or not isinstance(result.get("text"), str):
        raise BackendError("backend result has no 'text' string", retryable=False)
    counts = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = result.get(key)
        counts.append(value if type(value) is int and value >= 0 else None)
    return result["text"], counts[0], counts[1]


def chunk_text(data: Any) -> str:
    """The text of one streamed chunk (``{"text": str}``)."""
    if isinstance(data, Mapping) and isinstance(data.get("text"), str):
        text: str = data["text"]
        return text
    raise BackendError("backend stream chunk has no 'text' string", retryable=False)


def _words(text: str) -> int:
    return len(text.split())


# -- reading fields -------------------------------------------------------------


def object_field(body: Mapping[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}{key}' must be an object")
    return value


def int_field(body: Mapping[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadRequest(f"'{where}{key}' must be a positive integer")
    return value


def seed_field(body: Mapping[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < 2**63:
        raise BadRequest(f"'{where}{key}' must be an integer in [0, 2**63)")
    return value


def number_field(body: Mapping[str, Any], key: str, where: str = "") -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"'{where}{key}' must be a number")
    return value


def bool_field(body: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{where}{key}' must be a boolean")
    return value


def backend_params(
    max_tokens: int | None,
    temperature: float | None,
    seed: int | None,
    extra: Mapping[str, Any],
) -> dict[str, Any]:
    params: dict[str, Any] = {}
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
    created: int = field(default_factory=lambda: int(time.time()))
    id: str = ""


class Dialect:
    """One route family's request format, bodies, errors and yields."""

    family: ClassVar[str]
    invalid_status: ClassVar[int] = 400
    id_prefix: ClassVar[str] = ""

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        raise NotImplementedError

    def new_id(self) -> str:
        return f"{self.id_prefix}{uuid.uuid4().hex[:24]}"

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        raise NotImplementedError

    def piece(self, job: Job, index: int, text: str) -> bytes:
        """The event for the ``index``-th streamed piece."""
        raise NotImplementedError

    def end(self, job: Job, index: int, text: str, usage: dict[str, int]) -> bytes:
        """The events that end a stream of ``index`` pieces whose full text is ``text``."""
        raise NotImplementedError

    def error(self, status: int, code: str, message: str) -> dict[str, Any]:
        raise NotImplementedError

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return sse(self.error(status, code, message))

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        """The dialect's own error fields for a 429 yield."""
        raise NotImplementedError

    def cold_start(self, job: Job, refusal: Yield) -> dict[str, Any] | None:
        """A 503 body that replaces the 429 while the backend is cold, if this dialect has one."""
        return None


def usage_of(
    job: Job, text: str, prompt_tokens: int | None, completion_tokens: int | None
) -> dict[str, int]:
    prompt = _words(job.prompt) if prompt_tokens is None else prompt_tokens
    completion = _words(text) if completion_tokens is None else completion_tokens
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }

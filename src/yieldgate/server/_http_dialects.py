"""What each HTTP dialect reads and writes: request parsing and response bodies.

Pure functions of JSON values (no I/O, no starlette), one class per route
family: ``ChatCompletions`` and ``Completions`` (OpenAI), ``HfModels``
(HuggingFace Inference API), ``TgiGenerate`` (``/generate``,
``/generate_stream`` and TGI's ``POST /``). Each family has its own error and
yield shape; every yield body also carries the governed protocol's fields
(``status``, ``retry_hint_ms``, ``inflight``, ``max_inflight``, ``reason``).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from yieldgate._headers import ESTIMATED_TIME_FIELD, LOADING_MESSAGE
from yieldgate.protocol import ErrorCode, YieldReason
from yieldgate.server.backends import BackendError
from yieldgate.server.governor import Yield

__all__ = [
    "BadRequest",
    "ChatCompletions",
    "Completions",
    "Dialect",
    "HfModels",
    "Job",
    "TgiGenerate",
    "dumps",
    "result_text",
    "retry_after_s",
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


def _object(body: Mapping[str, Any], key: str, where: str = "") -> dict[str, Any]:
    value = body.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequest(f"'{where}{key}' must be an object")
    return value


def _int(body: Mapping[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise BadRequest(f"'{where}{key}' must be a positive integer")
    return value


def _seed(body: Mapping[str, Any], key: str, where: str = "") -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value < 2**63:
        raise BadRequest(f"'{where}{key}' must be an integer in [0, 2**63)")
    return value


def _number(body: Mapping[str, Any], key: str, where: str = "") -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"'{where}{key}' must be a number")
    return value


def _bool(body: Mapping[str, Any], key: str, where: str = "") -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{where}{key}' must be a boolean")
    return value


def _backend_params(
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


# -- the dialects -----------------------------------------------------------------


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


class _OpenAI(Dialect):
    family = "openai"

    def _job(self, body: dict[str, Any], prompt: str, default_model: str) -> Job:
        """The job for ``prompt``, from the fields both OpenAI routes share."""
        model = body.get("model", default_model)
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' must be a non-empty string")
        n = body.get("n")
        if n is not None and (type(n) is not int or n != 1):
            raise BadRequest("only n=1 is supported")
        max_tokens = _int(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int(body, "max_tokens")
        params = _backend_params(
            max_tokens,
            _number(body, "temperature"),
            _seed(body, "seed"),
            _object(body, "backend_params"),
        )
        return Job(
            prompt=prompt,
            params=params,
            stream=_bool(body, "stream"),
            model=model,
            include_usage=_bool(
                _object(body, "stream_options"), "include_usage", "stream_options."
            ),
            id=self.new_id(),
        )

    def _chunk(self, job: Job, choice: dict[str, Any]) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": job.id,
            "object": self.chunk_object,
            "created": job.created,
            "model": job.model,
            "choices": [choice],
        }
        if job.include_usage:
            chunk["usage"] = None
        return chunk

    chunk_object: ClassVar[str]

    def _last_choice(self) -> dict[str, Any]:
        raise NotImplementedError

    def end(self, job: Job, index: int, text: str, usage: dict[str, int]) -> bytes:
        events = [sse(self._chunk(job, self._last_choice()))]
        if job.include_usage:
            events.append(sse({**self._chunk(job, {}), "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return b"".join(events)

    def error(self, status: int, code: str, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        message = (
            f"not admitted ({refusal.reason}): retry in about {refusal.retry_hint_ms} ms; "
            "nothing was queued"
        )
        return {
            "error": {"message": message, "type": "yield", "param": None, "code": refusal.reason}
        }


class ChatCompletions(_OpenAI):
    """``POST /v1/chat/completions``."""

    id_prefix = "chatcmpl-"
    chunk_object = "chat.completion.chunk"

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array")
        lines = [_message_line(i, message) for i, message in enumerate(messages)]
        return self._job(body, "\n".join(lines), default_model)

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        return {
            "id": job.id,
            "object": "chat.completion",
            "created": job.created,
            "model": job.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
            "system_fingerprint": None,
        }

    def piece(self, job: Job, index: int, text: str) -> bytes:
        delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
        return sse(
            self._chunk(job, {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None})
        )

    def _last_choice(self) -> dict[str, Any]:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}


def _message_line(i: int, message: Any) -> str:
    if not isinstance(message, dict):
        raise BadRequest(f"'messages[{i}]' must be an object")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"'messages[{i}].role' must be a non-empty string")
    content = message.get("content")
    if content is None or isinstance(content, str):
        return f"{role}: {content or ''}"
    if not isinstance(content, list):
        raise BadRequest(f"'messages[{i}].content' must be a string or an array of parts")
    texts = []
    for j, part in enumerate(content):
        if (
            not isinstance(part, dict)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            raise BadRequest(
                f"'messages[{i}].content[{j}]' must be a text part "
                '({"type": "text", "text": ...}); only text is supported'
            )
        texts.append(part["text"])
    return f"{role}: {''.join(texts)}"


class Completions(_OpenAI):
    """``POST /v1/completions``."""

    id_prefix = "cmpl-"
    chunk_object = "text_completion"

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (or an array of one string)")
        return self._job(body, prompt, default_model)

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        return {
            "id": job.id,
            "object": "text_completion",
            "created": job.created,
            "model": job.model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
            "usage": usage,
            "system_fingerprint": None,
        }

    def piece(self, job: Job, index: int, text: str) -> bytes:
        return sse(
            self._chunk(job, {"index": 0, "text": text, "logprobs": None, "finish_reason": None})
        )

    def _last_choice(self) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}


def _tgi_job(body: dict[str, Any], model: str, stream: bool) -> Job:
    inputs = body.get("inputs")
    if not isinstance(inputs, str):
        raise BadRequest("'inputs' must be a string")
    parameters = _object(body, "parameters")
    params = _backend_params(
        _int(parameters, "max_new_tokens", "parameters."),
        _number(parameters, "temperature", "parameters."),
        _seed(parameters, "seed", "parameters."),
        _object(parameters, "backend_params", "parameters."),
    )
    return Job(prompt=inputs, params=params, stream=stream, model=model)


def _tgi_error(status: int, code: str, message: str) -> dict[str, Any]:
    # TGI's error types where one fits (a request refused as it stands is
    # "validation"), the protocol's code otherwise.
    if status < 500:
        kind = "validation"
    elif code == ErrorCode.BACKEND_ERROR:
        kind = "generation"
    else:
        kind = code
    return {"error": message, "error_type": kind, "code": code}


def _tgi_piece(index: int, text: str, *, special: bool = False) -> dict[str, Any]:
    return {
        "index": index,
        "token": {"id": index, "text": text, "logprob": 0.0, "special": special},
        "generated_text": None,
        "details": None,
    }


class _TgiStream(Dialect):
    """TGI's server-sent events (errors too), also used by the HF route."""

    def piece(self, job: Job, index: int, text: str) -> bytes:
        return sse(_tgi_piece(index, text))

    def end(self, job: Job, index: int, text: str, usage: dict[str, int]) -> bytes:
        # Like TGI's end-of-sequence token: special, and the one with the full text.
        last = _tgi_piece(index, "", special=True)
        last["generated_text"] = text
        return sse(last)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return sse(_tgi_error(status, code, message))


class HfModels(_TgiStream):
    """``POST /models/{model_id}``: the HuggingFace Inference API."""

    family = "huggingface"

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        return _tgi_job(body, model_id or default_model, _bool(body, "stream"))

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        return [{"generated_text": text}]

    def error(self, status: int, code: str, message: str) -> dict[str, Any]:
        return {"error": message, "code": code}

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        return {
            "error": f"Model is overloaded ({refusal.reason}): retry in about "
            f"{refusal.retry_hint_ms} ms"
        }

    def cold_start(self, job: Job, refusal: Yield) -> dict[str, Any] | None:
        if refusal.reason != YieldReason.COLD_START:
            return None
        return {
            "error": f"Model {job.model} is {LOADING_MESSAGE}",
            ESTIMATED_TIME_FIELD: refusal.retry_hint_ms / 1000,
        }


class TgiGenerate(_TgiStream):
    """TGI's ``/generate`` (``stream`` false), ``/generate_stream`` (true) and ``POST /``
    (``stream`` None: the body says; a non-streamed answer is a one-element list)."""

    family = "tgi"
    invalid_status = 422

    def __init__(self, stream: bool | None) -> None:
        self.stream = stream

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        stream = _bool(body, "stream") if self.stream is None else self.stream
        return _tgi_job(body, default_model, stream)

    def ok(self, job: Job, text: str, usage: dict[str, int]) -> Any:
        answer = {"generated_text": text}
        return [answer] if self.stream is None else answer

    def error(self, status: int, code: str, message: str) -> dict[str, Any]:
        return _tgi_error(status, code, message)

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        return {"error": "Model is overloaded", "error_type": "overloaded"}

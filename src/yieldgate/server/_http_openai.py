"""The OpenAI dialect: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

Bodies, chunks and errors in OpenAI's shapes; a stream ends with
``data: [DONE]``, after a usage chunk when ``stream_options.include_usage``
asks for one. A yield is an error of type ``yield`` whose code is the reason.

``finish_reason`` is ``"length"`` when ``max_tokens`` ended the generation,
``"stop"`` otherwise; ``stop`` sequences are the backend's to honour (both
backends do). ``logprobs`` (chat: ``true`` with ``top_logprobs`` 0..20;
completions: 0..5) and ``top_p`` become ``params["logprobs"]`` (how many
alternatives) and ``params["top_p"]``, honoured by a backend whose
``features`` name them (the harness) and refused with a 400 naming them
otherwise (the app checks, before admission). Log-probabilities come back
in OpenAI's shapes, a stream's in each chunk: chat ``{"content": [{"token",
"logprob", "bytes", "top_logprobs"}], "refusal": null}``; completions
``{"tokens", "token_logprobs", "top_logprobs", "text_offset"}``, where each
``top_logprobs`` map also holds the sampled token (up to N + 1 entries, as
OpenAI says) and offsets count characters of the completion. A byte token
that is not whole UTF-8 is spelt ``bytes:\\xNN``, its ``bytes`` the byte.
A field asking for what no backend here does (``tools``, a
``response_format`` other than text, penalties, ...) is a 400
``invalid_request_error`` naming it, never silently ignored.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any, ClassVar

from yieldgate.server._http_dialect_base import (
    BadRequest,
    Dialect,
    Generated,
    Job,
    backend_params,
    bool_field,
    chunk_text,
    int_field,
    number_field,
    object_field,
    seed_field,
    sse,
    stop_field,
    top_p_field,
)
from yieldgate.server._http_logprobs import TokenLogprob, read_logprobs, token_text
from yieldgate.server.governor import Yield

__all__ = ["ChatCompletions", "Completions"]

# Fields this server cannot honour, each with the values that ask for nothing
# (what some clients send by default): anything else is refused.
_UNSUPPORTED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("response_format", ({"type": "text"},)),
    ("tools", ([],)),
    ("tool_choice", ("none", "auto")),
    ("functions", ([],)),
    ("function_call", ("none", "auto")),
    ("logit_bias", ({},)),
    ("presence_penalty", (0,)),
    ("frequency_penalty", (0,)),
    ("best_of", (1,)),
    ("echo", (False,)),
    ("suffix", ("",)),
)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for key, neutral in _UNSUPPORTED:
        value = body.get(key)
        if value is not None and not any(
            (value == n and type(value) is type(n)) or _same_number(value, n) for n in neutral
        ):
            raise BadRequest(f"'{key}' is not supported by this server", key)


def _same_number(value: Any, neutral: Any) -> bool:
    numbers = (int, float)
    return type(value) in numbers and type(neutral) in numbers and value == neutral


_MAX_TOP_LOGPROBS = 20  # chat's top_logprobs
_MAX_LOGPROBS = 5  # completions' logprobs


def _finish_reason(done: Generated) -> str:
    return "length" if done.finish_reason == "length" else "stop"


class _OpenAI(Dialect):
    family = "openai"

    def __init__(self, system_fingerprint: str = "yieldgate") -> None:
        self.system_fingerprint = system_fingerprint

    def _logprobs(self, body: dict[str, Any]) -> int | None:
        """How many alternatives each token's log-probability comes with; ``None``: none asked."""
        raise NotImplementedError

    def _job(self, body: dict[str, Any], prompt: str, default_model: str) -> Job:
        """The job for ``prompt``, from the fields both OpenAI routes share."""
        model = body.get("model", default_model)
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' must be a non-empty string", "model")
        n = body.get("n")
        if n is not None and (type(n) is not int or n != 1):
            raise BadRequest("only n=1 is supported", "n")
        _refuse_unsupported(body)
        max_tokens = int_field(body, "max_completion_tokens")
        if max_tokens is None:
            max_tokens = int_field(body, "max_tokens")
        params = backend_params(
            max_tokens,
            number_field(body, "temperature"),
            seed_field(body, "seed"),
            object_field(body, "backend_params"),
            stop_field(body, "stop"),
        )
        # As for the other fields, what backend_params says wins.
        logprobs, top_p = self._logprobs(body), top_p_field(body)
        if logprobs is not None:
            params.setdefault("logprobs", logprobs)
        if top_p is not None:
            params.setdefault("top_p", top_p)
        return Job(
            prompt=prompt,
            params=params,
            stream=bool_field(body, "stream"),
            model=model,
            include_usage=bool_field(
                object_field(body, "stream_options"), "include_usage", "stream_options."
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
            "system_fingerprint": self.system_fingerprint,
        }
        if job.include_usage:
            chunk["usage"] = None
        return chunk

    chunk_object: ClassVar[str]

    def _last_choice(self, finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def end(self, job: Job, index: int, done: Generated) -> bytes:
        events = [sse(self._chunk(job, self._last_choice(_finish_reason(done))))]
        if job.include_usage:
            events.append(sse({**self._chunk(job, {}), "choices": [], "usage": done.usage}))
        events.append(b"data: [DONE]\n\n")
        return b"".join(events)

    def error(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": param, "code": code}}

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

    def _logprobs(self, body: dict[str, Any]) -> int | None:
        asked = bool_field(body, "logprobs")
        top = body.get("top_logprobs")
        if top is not None and (type(top) is not int or not 0 <= top <= _MAX_TOP_LOGPROBS):
            raise BadRequest(
                f"'top_logprobs' must be an integer in [0, {_MAX_TOP_LOGPROBS}]", "top_logprobs"
            )
        if not asked:
            if top:
                raise BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs")
            return None
        return top or 0

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array", "messages")
        lines = [_message_line(i, message) for i, message in enumerate(messages)]
        return self._job(body, "\n".join(lines), default_model)

    def ok(self, job: Job, done: Generated) -> Any:
        return {
            "id": job.id,
            "object": "chat.completion",
            "created": job.created,
            "model": job.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": done.text, "refusal": None},
                    "logprobs": _chat_logprobs(done.logprobs),
                    "finish_reason": _finish_reason(done),
                }
            ],
            "usage": done.usage,
            "system_fingerprint": self.system_fingerprint,
        }

    def piece(self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None) -> bytes:
        return self._piece(job, index, text, None)

    def piece_of(self, job: Job, index: int, data: Any) -> bytes:
        return self._piece(job, index, chunk_text(data), read_logprobs(data))

    def _piece(
        self, job: Job, index: int, text: str, logprobs: Sequence[TokenLogprob] | None
    ) -> bytes:
        delta = {"role": "assistant", "content": text} if index == 0 else {"content": text}
        choice = {
            "index": 0,
            "delta": delta,
            "logprobs": _chat_logprobs(logprobs),
            "finish_reason": None,
        }
        return sse(self._chunk(job, choice))

    def _last_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "delta": {}, "logprobs": None, "finish_reason": finish_reason}


def _chat_logprobs(logprobs: Sequence[TokenLogprob] | None) -> dict[str, Any] | None:
    if logprobs is None:
        return None
    return {
        "content": [
            {
                "token": token_text(entry.token_id),
                "logprob": entry.logprob,
                "bytes": [entry.token_id],
                "top_logprobs": [
                    {"token": token_text(token_id), "logprob": logprob, "bytes": [token_id]}
                    for token_id, logprob in entry.top
                ],
            }
            for entry in logprobs
        ],
        "refusal": None,
    }


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

    def _logprobs(self, body: dict[str, Any]) -> int | None:
        value = body.get("logprobs")
        if value is None or value is False:
            return None
        if type(value) is not int or not 0 <= value <= _MAX_LOGPROBS:
            raise BadRequest(f"'logprobs' must be an integer in [0, {_MAX_LOGPROBS}]", "logprobs")
        return value

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise BadRequest("'prompt' must be a string (or an array of one string)", "prompt")
        return self._job(body, prompt, default_model)

    def ok(self, job: Job, done: Generated) -> Any:
        choice = {
            "index": 0,
            "text": done.text,
            "logprobs": _completion_logprobs(done.logprobs, 0, done.text),
            "finish_reason": _finish_reason(done),
        }
        return {
            "id": job.id,
            "object": "text_completion",
            "created": job.created,
            "model": job.model,
            "choices": [choice],
            "usage": done.usage,
            "system_fingerprint": self.system_fingerprint,
        }

    def piece(self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None) -> bytes:
        return self._piece(job, text, None)

    def piece_of(self, job: Job, index: int, data: Any) -> bytes:
        return self._piece(job, chunk_text(data), read_logprobs(data))

    def _piece(self, job: Job, text: str, logprobs: Sequence[TokenLogprob] | None) -> bytes:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": _completion_logprobs(logprobs, job.sent_chars, text),
            "finish_reason": None,
        }
        job.sent_chars += len(text)
        return sse(self._chunk(job, choice))

    def _last_choice(self, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": "", "logprobs": None, "finish_reason": finish_reason}


def _completion_logprobs(
    logprobs: Sequence[TokenLogprob] | None, start: int, text: str
) -> dict[str, Any] | None:
    """The legacy shape, ``text_offset`` counting from ``start`` (the characters before
    ``text``); a token whose character is not complete yet sits where that character will."""
    if logprobs is None:
        return None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    offsets = []
    decoded = 0
    for entry in logprobs:
        offsets.append(start + min(decoded, len(text)))
        decoded += len(decoder.decode(bytes([entry.token_id])))
    top_logprobs = []
    for entry in logprobs:
        top = {token_text(token_id): logprob for token_id, logprob in entry.top}
        top.setdefault(token_text(entry.token_id), entry.logprob)
        top_logprobs.append(top)
    return {
        "tokens": [token_text(entry.token_id) for entry in logprobs],
        "token_logprobs": [entry.logprob for entry in logprobs],
        "top_logprobs": top_logprobs,
        "text_offset": offsets,
    }

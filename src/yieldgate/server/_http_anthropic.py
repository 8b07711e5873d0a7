"""The Anthropic dialect: ``POST /v1/messages``, the Messages API.

Request: ``model`` and ``max_tokens`` (both required, as Anthropic requires
them), ``messages`` (``role`` ``user`` or ``assistant``; ``content`` a string
or an array of ``text`` blocks), ``system`` (a string or ``text`` blocks),
``stop_sequences`` (at most four, what the backends take), ``temperature``
(0 to 1), ``top_p`` (honoured by a backend whose ``features`` name it,
refused with a 400 by the others) and ``stream``; ``metadata``,
``service_tier``, ``user_profile_id`` and ``workspace_id`` are accepted and
change nothing here. The prompt the backend gets (and the quota counts) is
one ``role: text`` line per message, after a ``system: ...`` line when there
is a system prompt: the lines the chat route builds, and what the SDK's cost
estimate reads (``yieldgate.dialects``).

Refused with a 400 ``invalid_request_error`` naming what is refused: a
content block of another type (``image``, ``document``, ``tool_use``, ...),
a field asking for what no backend here does (``tools``, a ``tool_choice``
other than ``auto`` or ``none``, ``thinking`` other than disabled,
``top_k``, ``cache_control``, ...), ``max_tokens: 0`` (prompt-cache
warming), and, as Anthropic refuses them, fields the API does not have.

Reply: a ``message`` of one ``text`` block; ``stop_reason`` ``end_turn``,
``max_tokens`` or ``stop_sequence`` (then ``stop_sequence`` names which);
``usage`` in ``input_tokens`` and ``output_tokens``. Streamed as
Anthropic's named server-sent events: ``message_start`` (the message, its
content empty), ``content_block_start``, ``ping``, a ``content_block_delta``
(``text_delta``) per piece of text, ``content_block_stop``,
``message_delta`` (``stop_reason``, ``stop_sequence``, the usage) and
``message_stop``; a failure once the stream has begun is an ``error`` event.

Errors are ``{"type": "error", "error": {"type", "message"}}``, typed by
status (``_http_responses.anthropic_error``); a yield is a 529
``overloaded_error``, as Anthropic answers when it is overloaded.
"""

from __future__ import annotations

from typing import Any

from yieldgate.server._http_dialect_base import (
    BadRequest,
    Dialect,
    Generated,
    Job,
    backend_params,
    bool_field,
    dumps,
    number_field,
    object_field,
    refuse_unsupported,
    top_p_field,
)
from yieldgate.server._http_responses import anthropic_error
from yieldgate.server.governor import Yield

__all__ = ["AnthropicMessages"]

_MAX_STOPS = 4  # what the backends take (``backends.stop_sequences``)
_ROLES = ("user", "assistant")
_SERVICE_TIERS = ("auto", "standard_only")
_STOP_REASONS = {"length": "max_tokens", "stop_sequence": "stop_sequence", "eos": "end_turn"}

# Fields no backend here honours, each with the values that ask for nothing.
_UNSUPPORTED: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("tools", ([],)),
    ("thinking", ({"type": "disabled"},)),
    ("top_k", ()),
    ("cache_control", ()),
    ("container", ()),
    ("context_management", ()),
    ("diagnostics", ()),
    ("inference_geo", ()),
    ("mcp_servers", ([],)),
    ("output_config", ({},)),
    ("output_format", ()),
    ("speed", ("standard",)),
)
# Every field the API has: read here, accepted as asking for nothing, or refused above.
# ``backend_params`` is this server's own (as on the other routes).
_KNOWN = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "stream",
        "metadata",
        "service_tier",
        "user_profile_id",
        "workspace_id",
        "tool_choice",
        "backend_params",
        *(name for name, _ in _UNSUPPORTED),
    }
)


def _event(name: str, data: dict[str, Any]) -> bytes:
    """One named server-sent event, as Anthropic sends them."""
    return b"event: " + name.encode("ascii") + b"\ndata: " + dumps(data) + b"\n\n"


_BLOCK_START = _event(
    "content_block_start",
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
)
_PING = _event("ping", {"type": "ping"})
_BLOCK_STOP = _event("content_block_stop", {"type": "content_block_stop", "index": 0})
_MESSAGE_STOP = _event("message_stop", {"type": "message_stop"})


def _block_text(where: str, block: Any) -> str:
    if not isinstance(block, dict):
        raise BadRequest(f"'{where}' must be a content block (an object)", where)
    kind = block.get("type")
    if not isinstance(kind, str):
        raise BadRequest(f"'{where}.type' must be a string", f"{where}.type")
    if kind != "text":
        raise BadRequest(
            f"'{where}': content blocks of type '{kind}' are not supported by this server "
            "(only 'text')",
            f"{where}.type",
        )
    text = block.get("text")
    if not isinstance(text, str):
        raise BadRequest(f"'{where}.text' must be a string", f"{where}.text")
    if block.get("cache_control") is not None:
        raise BadRequest(
            f"'{where}.cache_control' is not supported by this server", f"{where}.cache_control"
        )
    return text


def _content_text(where: str, content: Any) -> str:
    """A string, or the text of an array of ``text`` blocks."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or an array of content blocks", where)
    return "".join(_block_text(f"{where}[{j}]", block) for j, block in enumerate(content))


def _message_line(i: int, message: Any) -> str:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadRequest(f"'{where}' must be an object", where)
    role = message.get("role")
    if role not in _ROLES:
        hint = " (a system prompt is the top-level 'system')" if role == "system" else ""
        raise BadRequest(f"'{where}.role' must be 'user' or 'assistant'{hint}", f"{where}.role")
    if "content" not in message:
        raise BadRequest(f"'{where}.content' is required", f"{where}.content")
    return f"{role}: {_content_text(f'{where}.content', message['content'])}"


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_tokens")
    if value is None:
        raise BadRequest("'max_tokens' is required", "max_tokens")
    if type(value) is not int or value < 0:
        raise BadRequest("'max_tokens' must be a non-negative integer", "max_tokens")
    if value == 0:
        raise BadRequest(
            "'max_tokens': 0 (warming the prompt cache) is not supported by this server",
            "max_tokens",
        )
    return value


def _stop_sequences(body: dict[str, Any]) -> list[str] | None:
    value = body.get("stop_sequences")
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(s, str) and s for s in value):
        raise BadRequest("'stop_sequences' must be an array of non-empty strings", "stop_sequences")
    if len(value) > _MAX_STOPS:
        raise BadRequest(
            f"'stop_sequences': at most {_MAX_STOPS} are supported by this server",
            "stop_sequences",
        )
    return value or None


def _refuse(body: dict[str, Any]) -> None:
    """A 400 for a field the API does not have, or one asking for what no backend does."""
    for key in body:
        if key not in _KNOWN:
            raise BadRequest(f"'{key}': extra inputs are not permitted", key)
    refuse_unsupported(body, _UNSUPPORTED)
    choice = body.get("tool_choice")
    if choice is not None and not (
        isinstance(choice, dict) and choice.get("type") in ("auto", "none")
    ):
        raise BadRequest(
            "'tool_choice' is not supported by this server (no tools: only auto or none)",
            "tool_choice",
        )
    tier = body.get("service_tier")
    if tier is not None and tier not in _SERVICE_TIERS:
        raise BadRequest("'service_tier' must be 'auto' or 'standard_only'", "service_tier")


def _num_tokens(text: str) -> int:
    """Tokens of ``text`` for the served byte-level tokenizer: its UTF-8 bytes."""
    return len(text.encode("utf-8", "surrogatepass"))


class AnthropicMessages(Dialect):
    """``POST /v1/messages``."""

    family = "anthropic"
    yield_status = 529
    id_prefix = "msg_"

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise BadRequest("'model' is required: a non-empty string", "model")
        max_tokens = _max_tokens(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array", "messages")
        lines = [_message_line(i, message) for i, message in enumerate(messages)]
        system = body.get("system")
        if system is not None:
            text = _content_text("system", system)
            if text:
                lines.insert(0, f"system: {text}")
        _refuse(body)
        object_field(body, "metadata")
        temperature = number_field(body, "temperature")
        if temperature is not None and not 0 <= temperature <= 1:
            raise BadRequest("'temperature' must be a number in [0, 1]", "temperature")
        params = backend_params(
            max_tokens,
            temperature,
            None,
            object_field(body, "backend_params"),
            _stop_sequences(body),
        )
        top_p = top_p_field(body)
        if top_p is not None:  # a backend without the feature refuses it before admission
            params.setdefault("top_p", top_p)
        return Job(
            prompt="\n".join(lines),
            params=params,
            stream=bool_field(body, "stream"),
            model=model,
            id=self.new_id(),
        )

    def _stop(self, job: Job, done: Generated) -> dict[str, Any]:
        reason = _STOP_REASONS.get(done.finish_reason, "end_turn")
        matched = done.stop_sequence
        stops = job.params.get("stop")
        if reason == "stop_sequence" and matched is None and isinstance(stops, list):
            matched = stops[0] if len(stops) == 1 else None  # a backend that did not say
        return {"stop_reason": reason, "stop_sequence": matched}

    def ok(self, job: Job, done: Generated) -> Any:
        return {
            "id": job.id,
            "type": "message",
            "role": "assistant",
            "model": job.model,
            "content": [{"type": "text", "text": done.text}],
            **self._stop(job, done),
            "usage": {
                "input_tokens": done.usage["prompt_tokens"],
                "output_tokens": done.usage["completion_tokens"],
            },
        }

    def _start(self, job: Job) -> bytes:
        """The events that open a stream: the message, its one text block, a ping."""
        message: dict[str, Any] = {
            "id": job.id,
            "type": "message",
            "role": "assistant",
            "model": job.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": _num_tokens(job.prompt), "output_tokens": 0},
        }
        start = _event("message_start", {"type": "message_start", "message": message})
        return start + _BLOCK_START + _PING

    def piece(self, job: Job, index: int, text: str, token_ids: tuple[int, ...] | None) -> bytes:
        head = self._start(job) if index == 0 else b""
        if not text:  # a token that ends no character yet
            return head
        delta = {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": text},
        }
        return head + _event("content_block_delta", delta)

    def end(self, job: Job, index: int, done: Generated) -> bytes:
        head = self._start(job) if index == 0 else b""
        delta = {
            "type": "message_delta",
            "delta": self._stop(job, done),
            "usage": {
                "input_tokens": done.usage["prompt_tokens"],
                "output_tokens": done.usage["completion_tokens"],
            },
        }
        return head + _BLOCK_STOP + _event("message_delta", delta) + _MESSAGE_STOP

    def error(
        self, status: int, code: str, message: str, param: str | None = None
    ) -> dict[str, Any]:
        return anthropic_error(status, message)

    def stream_error(self, status: int, code: str, message: str) -> bytes:
        return _event("error", anthropic_error(status, message))

    def yield_fields(self, refusal: Yield) -> dict[str, Any]:
        message = (
            f"Overloaded: not admitted ({refusal.reason}); retry in about "
            f"{refusal.retry_hint_ms} ms; nothing was queued"
        )
        return anthropic_error(529, message)

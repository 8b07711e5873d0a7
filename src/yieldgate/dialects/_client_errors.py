"""What the official clients' exceptions mean, for code that wraps a client call.

``gate.call(client.chat.completions.create, ..., classify=yieldgate.dialects.OPENAI)``
puts the whole client call under the Gate (the client's own retries off): the
Gate then sees the client's exceptions, not responses. A dialect reads them
as it reads responses:

- an error that carries the HTTP response it came from (openai's
  ``APIStatusError``, huggingface_hub's ``HfHubHTTPError``) is classified
  from that response, headers and body, by the dialect's own rules: a 429
  with ``retry-after-ms`` is a yield with its hint, a loading model's 503 a
  cold start. The outcome's error is the client's exception, so a call that
  fails ends with it as the cause;
- errors that say the connection failed or timed out (openai's and
  anthropic's ``APIConnectionError`` and ``APITimeoutError``, huggingface_hub's
  ``InferenceTimeoutError``) are retryable;
- the ``text-generation`` client raises one class per error type and keeps
  no response: ``OverloadedError`` (TGI's 429 ``overloaded``) and
  ``RateLimitExceededError`` are yields without a hint, ``ShardNotReadyError``
  a cold start, ``ShardTimeoutError`` retryable, and the rest (bad requests,
  validation, a failed generation) fatal.

The clients are recognised by the names of their classes, so nothing here
imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from yieldgate.gate import Outcome, OutcomeKind

__all__ = ["client_error_outcome"]

# (module prefix, class name) of errors that mean "no answer came, try again".
_RETRYABLE: Final = {
    ("openai", "APIConnectionError"),  # APITimeoutError is one too
    ("anthropic", "APIConnectionError"),  # so is anthropic's
    ("huggingface_hub", "InferenceTimeoutError"),
    ("text_generation", "ShardTimeoutError"),
}
_TEXT_GENERATION_YIELDS: Final = {
    "OverloadedError": "overloaded",
    "RateLimitExceededError": "rate_limited",
    "ShardNotReadyError": "cold_start",
}
_TEXT_GENERATION_FATAL: Final = {
    "BadRequestError",
    "ValidationError",
    "GenerationError",
    "IncompleteGenerationError",
    "NotFoundError",
    "NotSupportedError",
    "UnknownError",
}


def _named(error: BaseException) -> list[tuple[str, str]]:
    return [(cls.__module__.split(".")[0], cls.__name__) for cls in type(error).__mro__]


def client_error_outcome(
    error: BaseException, classify_response: Callable[[Any], Outcome]
) -> Outcome | None:
    """The outcome of an official client's ``error``, or ``None`` for one no client raised."""
    response: Any = getattr(error, "response", None)
    if _is_response(response) and response.status_code >= 400:
        read = classify_response(response)
        # The client's error is what a caller sees if the call fails; the response stays as value.
        return _with_error(read, error)
    names = _named(error)
    if any(name in _RETRYABLE for name in names):
        return Outcome.retryable(error)
    module, name = names[0]
    if module == "text_generation":
        if name in _TEXT_GENERATION_YIELDS:
            return Outcome(OutcomeKind.YIELD, None, None, _TEXT_GENERATION_YIELDS[name], error)
        if name in _TEXT_GENERATION_FATAL:
            return Outcome.fatal(error)
    return None


def _with_error(outcome: Outcome, error: BaseException) -> Outcome:
    if outcome.kind is OutcomeKind.OK:  # a client that raised on a 2xx: its own reason
        return Outcome.fatal(error)
    return Outcome(outcome.kind, outcome.value, outcome.hint_s, outcome.reason, error)


def _is_response(value: Any) -> bool:
    return isinstance(getattr(value, "status_code", None), int) and hasattr(value, "headers")

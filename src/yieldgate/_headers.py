"""Every HTTP header name yieldgate reads or writes, spelled once.

Names are lower case, as HTTP/2 and ASGI carry them (HTTP/1.1 compares them
case-insensitively); ``IDEMPOTENCY_KEY_HEADER`` keeps the casing openai-python
sends. ``PRIORITY_HEADER`` and ``DEADLINE_HEADER`` are public as
``yieldgate.protocol.PRIORITY_HEADER`` and ``DEADLINE_HEADER``.

Two names of HuggingFace's "model is loading" reply are here too, though they
are in its body: the server writes them and the ``huggingface`` dialect reads them.

Only the standard library: the protocol module, the fronts and the dialects
all import it.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "AUTHORIZATION_HEADER",
    "CACHE_CONTROL_HEADER",
    "CONNECTION_HEADER",
    "CONTENT_ENCODING_HEADER",
    "CONTENT_LENGTH_HEADER",
    "CONTENT_TYPE_HEADER",
    "DEADLINE_HEADER",
    "ESTIMATED_TIME_FIELD",
    "IDEMPOTENCY_KEY_HEADER",
    "LLM_D_DROPPED_REASON_HEADER",
    "LOADING_MESSAGE",
    "MS_RETRY_AFTER_MS_HEADER",
    "PRIORITY_HEADER",
    "RATELIMIT_LIMIT_REQUESTS_HEADER",
    "RATELIMIT_LIMIT_TOKENS_HEADER",
    "RATELIMIT_REMAINING_REQUESTS_HEADER",
    "RATELIMIT_REMAINING_TOKENS_HEADER",
    "RATELIMIT_RESET_REQUESTS_HEADER",
    "RATELIMIT_RESET_TOKENS_HEADER",
    "RETRY_AFTER_HEADER",
    "RETRY_AFTER_MS_HEADER",
    "SHOULD_RETRY_HEADER",
    "TRANSFER_ENCODING_HEADER",
    "WWW_AUTHENTICATE_HEADER",
    "X_ACCEL_BUFFERING_HEADER",
    "X_API_KEY_HEADER",
]

PRIORITY_HEADER: Final = "x-yieldgate-priority"
"""The HTTP header that carries a request's priority (``high``, ``normal``, ``low``)."""
DEADLINE_HEADER: Final = "x-yieldgate-deadline-ms"
"""The HTTP header that carries the caller's remaining time budget in milliseconds."""

RETRY_AFTER_MS_HEADER: Final = "retry-after-ms"
"""The retry hint in milliseconds; wins over ``retry-after``."""
MS_RETRY_AFTER_MS_HEADER: Final = "x-ms-retry-after-ms"
"""Azure's copy of ``retry-after-ms``."""
RETRY_AFTER_HEADER: Final = "retry-after"
"""The retry hint in seconds, or an HTTP date (RFC 9110)."""
SHOULD_RETRY_HEADER: Final = "x-should-retry"
"""``true`` or ``false``: the server's verdict on whether sending again may succeed."""
IDEMPOTENCY_KEY_HEADER: Final = "Idempotency-Key"
"""One key per call, the same on every attempt, so that the server may drop a repeat."""

# OpenAI's quota headers, on every response: the bucket's size (one minute's
# limit), what is left of it, and the time until it is full again (``6m0s``).
RATELIMIT_LIMIT_REQUESTS_HEADER: Final = "x-ratelimit-limit-requests"
RATELIMIT_LIMIT_TOKENS_HEADER: Final = "x-ratelimit-limit-tokens"
RATELIMIT_REMAINING_REQUESTS_HEADER: Final = "x-ratelimit-remaining-requests"
RATELIMIT_REMAINING_TOKENS_HEADER: Final = "x-ratelimit-remaining-tokens"
RATELIMIT_RESET_REQUESTS_HEADER: Final = "x-ratelimit-reset-requests"
RATELIMIT_RESET_TOKENS_HEADER: Final = "x-ratelimit-reset-tokens"

LLM_D_DROPPED_REASON_HEADER: Final = "x-llm-d-request-dropped-reason"
"""Why llm-d's endpoint picker dropped a request: ``rejected-*`` (before dispatch), ``evicted*``."""

# Not headers: the JSON body of HuggingFace's "model is loading" 503.
ESTIMATED_TIME_FIELD: Final = "estimated_time"
"""Seconds until the model is expected to be loaded."""
LOADING_MESSAGE: Final = "currently loading"
"""What the ``error`` text says of a model that is still loading."""

AUTHORIZATION_HEADER: Final = "authorization"
WWW_AUTHENTICATE_HEADER: Final = "www-authenticate"
X_API_KEY_HEADER: Final = "x-api-key"
"""Where Anthropic's clients send their API key (instead of ``authorization``)."""
CONTENT_TYPE_HEADER: Final = "content-type"
CONTENT_LENGTH_HEADER: Final = "content-length"
CONTENT_ENCODING_HEADER: Final = "content-encoding"
TRANSFER_ENCODING_HEADER: Final = "transfer-encoding"
CACHE_CONTROL_HEADER: Final = "cache-control"
CONNECTION_HEADER: Final = "connection"
X_ACCEL_BUFFERING_HEADER: Final = "x-accel-buffering"
"""``no`` asks a proxy (nginx) not to buffer a stream."""

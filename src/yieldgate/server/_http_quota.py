"""The provider quota at the HTTP front: charge a parsed request, or answer the 429.

``charge_quota`` is asked once per parsed inference request, before the
Governor. Within the quota it returns a ``Charged``: its ``send`` adds the
rate-limit headers (as of the charge) to whatever response follows: the
success, a stream, a yield or an error; its ``settle`` is called once the
answer has ended, whatever ended it. Over the quota, it answers 429 itself
(the request takes no slot) and returns ``None``.

The 429 is OpenAI's: code ``rate_limit_exceeded``, type ``requests`` or
``tokens``, the message ending "Please try again in 1.234s." (or, for a
request larger than the whole token bucket, "Request too large ..."). A
token-limit 429 carries no ``retry-after``, as OpenAI sends none; a
request-limit 429 carries ``retry-after`` in whole seconds (rounded up).
Routes of other dialects answer the same message in their own error shape.

The Messages route (the ``anthropic`` family) spends Anthropic's buckets
(``ProviderQuota.charge_messages``: its prompt and its ``max_tokens``) and
answers as Anthropic does: ``anthropic-ratelimit-*`` headers, and a 429
``rate_limit_error`` with ``retry-after`` (whole seconds, rounded up)
whatever the limit; a request larger than a whole bucket has no
``retry-after`` and ``x-should-retry: false`` (no wait lets it through).
``settle`` gives back the output tokens its answer did not use.

In Azure's header mode (``QuotaConfig.headers == "azure"``) the 429 is
Azure OpenAI's: ``{"error": {"code": "429", "message": ...}}``, with
``retry-after`` (whole seconds, rounded up), ``retry-after-ms`` and
``x-ms-retry-after-ms`` whatever the resource.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.types import Message, Send

from yieldgate._headers import (
    MS_RETRY_AFTER_MS_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
)
from yieldgate.server._http_dialects import Dialect, Job, dumps
from yieldgate.server._http_responses import NO_RETRY, anthropic_error, send_json
from yieldgate.server.quota import ProviderQuota, QuotaDecision, QuotaRefusal

if TYPE_CHECKING:
    from yieldgate.server._http_front import Front

__all__ = ["RATE_LIMIT_EXCEEDED", "Charged", "charge_quota"]

RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"


def _settled(output_tokens: int) -> None:
    """Nothing to give back."""


@dataclass(frozen=True, slots=True)
class Charged:
    """A request within the quota: the ``send`` that answers it with the quota's headers,
    and ``settle(output_tokens)``, called once when its answer ends (what it generated)."""

    send: Send
    settle: Callable[[int], None] = _settled


def _max_tokens(job: Job) -> int | None:
    value = job.params.get("max_tokens")
    return value if type(value) is int and value > 0 else None


def _azure_message(refusal: QuotaRefusal) -> str:
    what = "token" if refusal.resource == "tokens" else "call"
    wait = math.ceil(refusal.retry_after_s or 0)
    return (
        f"Requests to the ChatCompletions_Create Operation have exceeded {what} rate limit "
        f"of your current OpenAI S0 pricing tier. Please retry after {wait} seconds."
    )


def _body(dialect: Dialect, refusal: QuotaRefusal, azure: bool) -> bytes:
    if dialect.family == "anthropic":
        return dumps(anthropic_error(429, refusal.message))
    if azure and dialect.family == "openai" and not refusal.too_large:
        return dumps({"error": {"code": "429", "message": _azure_message(refusal)}})
    if dialect.family == "openai":
        error = {
            "message": refusal.message,
            "type": refusal.resource,
            "param": None,
            "code": RATE_LIMIT_EXCEEDED,
        }
        return dumps({"error": error})
    return dumps(dialect.error(429, RATE_LIMIT_EXCEEDED, refusal.message))


def _decide(quota: ProviderQuota, dialect: Dialect, job: Job) -> QuotaDecision:
    """Charge ``job`` to the buckets of its route's provider."""
    if dialect.family == "anthropic":
        # The Messages route requires max_tokens: it is always there.
        output = _max_tokens(job) or 0
        return quota.charge_messages(quota.prompt_tokens(job.prompt), output, model=job.model)
    return quota.charge(quota.cost(job.prompt, _max_tokens(job)), model=job.model)


def _refusal_headers(refusal: QuotaRefusal, family: str, azure: bool) -> list[tuple[bytes, bytes]]:
    """The hint headers of a 429: per provider, as it sends them."""
    headers = []
    if refusal.retry_after_s is not None and (
        azure or refusal.resource == "requests" or family == "anthropic"
    ):
        retry_after = str(math.ceil(refusal.retry_after_s))
        headers.append((RETRY_AFTER_HEADER.encode(), retry_after.encode()))
    if refusal.retry_after_s is not None and azure and family != "anthropic":
        millis = str(math.ceil(refusal.retry_after_s * 1000)).encode()
        headers.append((RETRY_AFTER_MS_HEADER.encode(), millis))
        headers.append((MS_RETRY_AFTER_MS_HEADER.encode(), millis))
    if refusal.too_large and family == "anthropic":
        headers.append(NO_RETRY)
    return headers


async def charge_quota(front: Front, dialect: Dialect, job: Job, send: Send) -> Charged | None:
    """Charge ``job`` to the front's quota: what to answer it with, or ``None`` once it
    was answered 429. Without a quota, ``send`` as it is."""
    quota = front.quota
    if quota is None:
        return Charged(send)
    decision = _decide(quota, dialect, job)
    headers = [(name.encode(), value.encode()) for name, value in decision.headers]
    refusal = decision.refusal
    if refusal is not None:
        azure = quota.config.headers == "azure"
        headers.extend(_refusal_headers(refusal, dialect.family, azure))
        await send_json(send, 429, _body(dialect, refusal, azure), headers)
        return None

    async def with_quota_headers(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *headers]}
        await send(message)

    if dialect.family != "anthropic":
        return Charged(with_quota_headers)
    charged, model = _max_tokens(job) or 0, job.model

    def settle(output_tokens: int) -> None:
        quota.settle_messages(charged, output_tokens, model=model)

    return Charged(with_quota_headers, settle)

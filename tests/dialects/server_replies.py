"""Overload and rate-limit replies as each server writes them, with where each comes from.

Every reply names the public source it was read from: repository, file and,
where one was at hand, the commit. What a dialect makes of each one is the
table "What each server sends" in docs/http.md, which test_servers.py runs.
Bodies that carry ids or counts hold made-up values of the right shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass(frozen=True, slots=True)
class ServerReply:
    status: int
    body: Any  # a JSON value, or str for a plain-text body
    headers: dict[str, str] = field(default_factory=dict)

    def response(self, lib: Any = httpx) -> Any:
        content = self.body.encode() if isinstance(self.body, str) else json.dumps(self.body)
        return lib.Response(self.status, headers=self.headers, content=content)


def _openai_error(message: str, type_: Any, code: Any) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


_GEMINI_METRIC = "generativelanguage.googleapis.com/generate_content_free_tier_requests"


def _gemini_quota(quota_id: str) -> dict[str, Any]:
    return {
        "@type": "type.googleapis.com/google.rpc.QuotaFailure",
        "violations": [
            {
                "quotaMetric": _GEMINI_METRIC,
                "quotaId": quota_id,
                "quotaDimensions": {"location": "global", "model": "gemini-2.0-flash"},
                "quotaValue": "15",
            }
        ],
    }


def _gemini_retry(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


_GEMINI_HELP = {
    "@type": "type.googleapis.com/google.rpc.Help",
    "links": [
        {
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits",
        }
    ],
}


def _gemini_error(code: int, status: str, message: str, *details: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    return {"error": error}


_GEMINI_QUOTA = (
    "You exceeded your current quota, please check your plan and billing details. "
    "For more information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)
_PER_MINUTE = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier"
_PER_DAY = "GenerateRequestsPerDayPerProjectPerModel-FreeTier"

_VLLM_BUSY = (
    "The engine is currently busy and cannot accept new requests. "
    "Please try again later or on a different instance."
)
_VLLM_BACKLOG = (
    "The engine has reached its prefill token backlog limit. "
    "Please try again later or on a different instance."
)

REPLIES: dict[str, ServerReply] = {
    # vLLM past --max-num-queued-reqs: vllm-project/vllm, vllm/exceptions.py,
    # QueueOverflowError (a GracefulHTTPError with HTTPStatus.SERVICE_UNAVAILABLE),
    # raised by AsyncLLM's admission check in vllm/v1/engine/async_llm.py. Read
    # from the search index's copy: no commit at hand (the stored snapshot of the
    # repository was too large to fetch). The error body is vLLM's ErrorResponse
    # ({"error": {message, type, param, code}}); its type, the status phrase, is
    # as the vLLM fork aphrodite-engine's create_error_response writes a
    # GracefulHTTPError (vLLM's own was not read). The rule reads only the message.
    "vllm-queue-full": ServerReply(503, _openai_error(_VLLM_BUSY, "Service Unavailable", 503)),
    # vLLM past --max-num-queued-tokens: same file, MaxQueuedTokensError.
    "vllm-token-backlog": ServerReply(
        503, _openai_error(_VLLM_BACKLOG, "Service Unavailable", 503)
    ),
    # TGI past --max-concurrent-requests: huggingface/text-generation-inference
    # @db931fcf42da018a3657580c64bf2720f167f9ab, router/src/infer/mod.rs (the
    # semaphore's try_acquire_owned fails: InferError::Overloaded) and
    # router/src/server.rs (From<InferError>: Overloaded -> 429, ErrorResponse
    # {error, error_type}); the same body on /generate and /v1/chat/completions.
    "tgi-overloaded": ServerReply(
        429, {"error": "Model is overloaded", "error_type": "overloaded"}
    ),
    # NVIDIA Dynamo, every worker over its busy threshold: ai-dynamo/dynamo
    # @43a0bb22fbd0293a2ff2348e6ebf64e60155ec09, lib/llm/src/http/service/error.rs
    # (SanitizedError::Overloaded: status DYN_HTTP_OVERLOAD_STATUS_CODE, 529 by
    # default, message "Service temporarily overloaded"); the body as
    # docs/fault-tolerance/request-rejection.md shows it ("Error Response").
    "dynamo-overloaded": ServerReply(
        529, {"message": "Service temporarily overloaded", "type": "Overloaded", "code": 529}
    ),
    # The same with DYN_HTTP_OVERLOAD_STATUS_CODE=503 (error.rs reads it once).
    "dynamo-overloaded-503": ServerReply(
        503, {"message": "Service temporarily overloaded", "type": "Overloaded", "code": 503}
    ),
    # Dynamo's /v1/messages (Anthropic) route: error.rs, anthropic_type() of
    # Overloaded is "overloaded_error".
    "dynamo-anthropic-overloaded": ServerReply(
        529,
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Service temporarily overloaded"},
        },
    ),
    # Dynamo before the 529: ai-dynamo/dynamo @e5d52eee56d24fe946c727db698d29f24f36b90a,
    # docs/fault-tolerance/request-rejection.md ("Error Response": 503).
    "dynamo-busy-503-older": ServerReply(
        503,
        {
            "message": "Service temporarily unavailable: All workers are busy, please retry later",
            "type": "service_unavailable",
            "code": 503,
        },
    ),
    # llm-d's endpoint picker, flow control full: llm-d/llm-d-router
    # @ebab687927f5331c1b39defcb579a07951bce56c, pkg/epp/requestcontrol/admission.go
    # (translateFlowControlOutcome: QueueOutcomeRejectedCapacity -> ResourceExhausted
    # with the header "rejected-saturated") and pkg/common/error/error.go
    # (ResourceExhausted -> 429, body "inference error: <code> - <msg>").
    "llm-d-saturated": ServerReply(
        429,
        "inference error: ResourceExhausted - request rejected by flow control",
        {"x-llm-d-request-dropped-reason": "rejected-saturated"},
    ),
    # Same file: the queue-wait TTL ran out with endpoints in the pool.
    "llm-d-ttl-expired": ServerReply(
        429,
        "inference error: ResourceExhausted - request timed out in queue: "
        "request rejected by flow control",
        {"x-llm-d-request-dropped-reason": "rejected-ttl-expired"},
    ),
    # Same file: no endpoints at all (a pool scaled to zero) -> ServiceUnavailable, 503.
    "llm-d-no-endpoints": ServerReply(
        503,
        "inference error: ServiceUnavailable - no endpoints available: "
        "request rejected by flow control",
        {"x-llm-d-request-dropped-reason": "rejected-no-endpoints"},
    ),
    # Evicted after dispatch: same repository, pkg/epp/handlers/server.go
    # (updateStateAndSendIfNeeded: ImmediateResponse 429 with the eviction reason)
    # and pkg/epp/flowcontrol/eviction/evictor.go (reason "evicted").
    "llm-d-evicted": ServerReply(
        429, "request evicted by flow control", {"x-llm-d-request-dropped-reason": "evicted"}
    ),
    # The Gateway API Inference Extension's own picker, before the header:
    # kubernetes-sigs/gateway-api-inference-extension
    # @1748e829d1161147aaf35e76699ec86fd88406d2, pkg/epp/requestcontrol/admission.go
    # (rejectIfSheddableAndSaturated) and pkg/common/error/error.go (429).
    "gaie-saturated": ServerReply(
        429, "inference error: ResourceExhausted - system saturated, sheddable request dropped"
    ),
    # Same commit, pkg/epp/handlers/server.go: an evicted request, 429 without a header.
    "gaie-evicted": ServerReply(429, "request evicted by flow control"),
    # Ray Serve past max_queued_requests: ray-project/ray, python/ray/serve/exceptions.py
    # (BackPressureError's message) and python/ray/serve/tests/test_backpressure.py
    # (503, text starting "Request dropped due to backpressure"). No commit at hand.
    "ray-serve-503": ServerReply(
        503,
        "Request dropped due to backpressure (num_queued_requests=2, max_queued_requests=2).",
    ),
    # Ray Serve with BackpressureConfig(status_code=429, retry_after_s=5):
    # python/ray/serve/config.py (status_code 503 or 429; retry_after_s sent as a
    # whole-second Retry-After) and python/ray/serve/_private/backpressure.py
    # (compute_retry_after_decision, the "static" policy).
    "ray-serve-429-retry-after": ServerReply(
        429,
        "Request dropped due to backpressure (num_queued_requests=64, max_queued_requests=64).",
        {"retry-after": "5"},
    ),
    # Anthropic, overloaded: anthropics/anthropic-sdk-python
    # @009b035305e0724ce108ebd796935f91711fc6e1, src/anthropic/_client.py
    # (_make_status_error: 529 -> OverloadedError), src/anthropic/types/shared/
    # error_response.py and overloaded_error.py (the body); docs.anthropic.com/en/api/errors.
    "anthropic-overloaded": ServerReply(
        529,
        {
            "type": "error",
            "error": {"type": "overloaded_error", "message": "Overloaded"},
            "request_id": "req_011CExample",
        },
    ),
    # Anthropic, rate limited: same files (429 -> RateLimitError,
    # rate_limit_error.py); retry-after in seconds and the anthropic-ratelimit-* headers.
    "anthropic-rate-limit": ServerReply(
        429,
        {
            "type": "error",
            "error": {
                "type": "rate_limit_error",
                "message": "This request would exceed the rate limit for your organization "
                "of 50 requests per minute.",
            },
        },
        {
            "retry-after": "12",
            "anthropic-ratelimit-requests-limit": "50",
            "anthropic-ratelimit-requests-remaining": "0",
            "anthropic-ratelimit-requests-reset": "2026-11-23T16:50:12Z",
        },
    ),
    # OpenAI, token rate limit: openai/openai-python
    # @e43b422412a9e96c9cc5192c61fffbe2d7e04836, src/openai/_client.py
    # (_make_status_error: 429 -> RateLimitError) and src/openai/_base_client.py
    # (hints from retry-after-ms / retry-after only); the body and headers as
    # platform.openai.com/docs/guides/error-codes and /rate-limits describe them.
    "openai-rate-limit": ServerReply(
        429,
        _openai_error(
            "Rate limit reached for gpt-4o in organization org-example on tokens per min "
            "(TPM): Limit 30000, Used 29818, Requested 1200. Please try again in 2.036s. "
            "Visit https://platform.openai.com/account/rate-limits to learn more.",
            "tokens",
            "rate_limit_exceeded",
        ),
        {
            "x-ratelimit-limit-tokens": "30000",
            "x-ratelimit-remaining-tokens": "0",
            "x-ratelimit-reset-tokens": "2.036s",
        },
    ),
    # OpenAI, spent balance: same sources; code insufficient_quota (no wait helps).
    "openai-insufficient-quota": ServerReply(
        429,
        _openai_error(
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
    ),
    # OpenAI, a request above the whole per-minute limit: the body as users quote it in
    # DrShushen/climb#13 and TheR1D/shell_gpt#653 (type tokens, code rate_limit_exceeded,
    # no wait in the message); the reference server's quota mode answers the same.
    "openai-request-too-large": ServerReply(
        429,
        _openai_error(
            "Request too large for gpt-4o in organization org-example on tokens per min "
            "(TPM): Limit 30000, Requested 31538. The input or output tokens must be "
            "reduced in order to run successfully. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "tokens",
            "rate_limit_exceeded",
        ),
    ),
    # Azure OpenAI, rate limit: learn.microsoft.com/azure/ai-services/openai/quotas-limits
    # (retry-after-ms and retry-after on a 429) and openai/openai-python
    # src/openai/lib/azure.py over src/openai/_base_client.py (retry-after-ms first).
    "azure-openai-rate-limit": ServerReply(
        429,
        {
            "error": {
                "code": "429",
                "message": "Requests to the ChatCompletions_Create Operation under Azure "
                "OpenAI API version 2024-10-21 have exceeded token rate limit of your current "
                "OpenAI S0 pricing tier. Please retry after 6 seconds.",
            }
        },
        {"retry-after-ms": "5712", "retry-after": "6"},
    ),
    # Gemini API, per-minute limit: the google.rpc.Status body (AIP-193) with QuotaFailure,
    # Help and RetryInfo details, as ai.google.dev/gemini-api/docs/generate-content/api-errors
    # lists 429 RESOURCE_EXHAUSTED and users quote the body; the quota ids as
    # ai.google.dev/gemini-api/docs/rate-limits names the limits (RPM, TPM, RPD).
    "gemini-rate-limit": ServerReply(
        429,
        _gemini_error(
            429,
            "RESOURCE_EXHAUSTED",
            _GEMINI_QUOTA,
            _gemini_quota(_PER_MINUTE),
            _GEMINI_HELP,
            _gemini_retry("22s"),
        ),
    ),
    # Gemini API, daily limit: the same body naming a per-day quota; its RetryInfo
    # points at midnight Pacific time, hours away.
    "gemini-daily-quota": ServerReply(
        429,
        _gemini_error(
            429,
            "RESOURCE_EXHAUSTED",
            _GEMINI_QUOTA,
            _gemini_quota(_PER_DAY),
            _GEMINI_HELP,
            _gemini_retry("34117.021553s"),
        ),
    ),
    # Gemini API, overloaded: 503 UNAVAILABLE ("The service may be temporarily overloaded
    # or down", the same page), no details.
    "gemini-overloaded": ServerReply(
        503, _gemini_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later.")
    ),
}

"""HTTP dialects: what a response of one API family means to the Gate.

A dialect turns an HTTP response into an ``Outcome``. Every dialect shares
the rules that the official clients apply (openai-python's among them):

=====================  ===============================================
2xx                    ``ok`` (the body is not read: it may be a stream)
``x-should-retry``     ``false``: ``fatal`` (before any body rule);
                       ``true``: retried whatever the status (then
                       ``retryable`` unless congestion)
429                    ``yield``, reason ``rate_limited``
529                    ``yield``, reason ``overloaded`` (Anthropic's and
                       NVIDIA Dynamo's "overloaded")
503                    ``overloaded`` (its retries spend budget)
408, 409, 5xx          ``retryable``
anything else          ``fatal`` (a 400 will not pass on a retry)
=====================  ===============================================

A 429 is a yield: the server refused the request at its door, before doing
any work, and (usually) said when to come back, exactly as a governed
``yield`` does. So waiting it out spends no retry budget and never trips the
breaker; the window still narrows, and ``max_yields`` and the deadline still
bound the waiting. A budget there would fail most calls of any burst that
meets a full or cold server, since every first attempt may be refused. A 503
may come from a proxy whose upstream did work or broke: it stays
``overloaded``, and its retries do spend budget.

The hint is ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP date).
On top of these, each family reads its own bodies:

In every dialect but ``gemini`` (which reads its own), a 429 for a daily or
monthly quota (a spent bucket whose header family names such a window, or a
body that says "per day", as OpenRouter's and Groq's do) is a ``yield``, reason
``daily_quota``, whose hint is when the quota refills; ``fatal`` when nothing
says when (``_daily``). The Gate fails such a call at once with
``QuotaExhaustedError`` unless the refill comes before its deadline.

- ``openai``: a 429 whose error code is ``insufficient_quota`` is ``fatal``
  (no wait makes a spent quota pass), and so is one whose message starts
  "Request too large for" (a request above the whole per-minute limit, reason
  ``request_too_large``); another 429 without a hint header
  takes its hint from the message ("Please try again in 1.234s", Azure's
  "Please retry after 6 seconds"). A 429 whose error type is ``yield``
  (yieldgate's reference server refusing at its door) is a yield whose reason
  is its code (``saturated``, ``cold_start``): load, not a model's quota, so
  the window narrows for it as for any overload (a ``rate_limited`` 429 of a
  call that names a model holds that model's quota alone).
- ``anthropic``: an ``overloaded_error`` (sent as 529) is a ``yield``, reason
  ``overloaded``; a ``rate_limit_error`` (429) a ``yield``, ``rate_limited``.
- ``huggingface``: a 503 with ``estimated_time`` (or "currently loading") is a
  model still loading: a ``yield`` with reason ``cold_start`` whose hint is
  ``estimated_time``. No official client reads it. A 429 "Model is overloaded"
  (TGI's refusal past ``max_concurrent_requests``, as endpoints relay it) is a
  ``yield``, ``overloaded``.
- ``tgi``: a 429 ``error_type: overloaded`` (TGI's ``max_concurrent_requests``)
  is a ``yield`` with reason ``overloaded`` (TGI sends no hint: backoff); a
  424 (the generation failed) is ``retryable``; 422 is ``fatal``.
- ``gemini`` (the Gemini API, google-genai's): the hint is the longer of the
  headers' and the body's ``RetryInfo.retryDelay`` (both say "at least this
  long"), in every status; a 429 whose ``QuotaFailure`` names a daily quota
  (or one of zero) is ``fatal``, reason ``daily_quota`` (``no_quota``): no
  wait within a call refills it; another 429 is a ``yield``, ``rate_limited``.
  503 ``UNAVAILABLE`` (overloaded), 500 and 504 keep the status rules (see
  ``_gemini``).
- ``governed-http`` (yieldgate's reference server, any route): a body with
  ``"status": "yield"`` is a ``yield`` with its ``retry_hint_ms`` and
  ``reason``; then the HuggingFace and TGI rules. It also sends the attempt's
  remaining time upstream (``x-yieldgate-deadline-ms``).

``openai`` and ``governed-http`` send an ``Idempotency-Key`` header, one key
per call and the same on each of its retries and hedges, so that a server
which deduplicates can tell a retry from a new request. HuggingFace's and
TGI's APIs have no such header.

Then, in every dialect, the refusals of particular servers (vLLM, NVIDIA
Dynamo, llm-d, Ray Serve: see ``_servers``), and last the status rules.

Error bodies are read only for non-2xx responses, as JSON; of a body that is
not JSON only the start is kept, as text, for the rules that match on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from yieldgate._headers import ESTIMATED_TIME_FIELD, IDEMPOTENCY_KEY_HEADER, LOADING_MESSAGE
from yieldgate.dialects._client_errors import client_error_outcome
from yieldgate.dialects._daily import daily_refusal
from yieldgate.dialects._gemini import retry_delay_s, spent_quota
from yieldgate.dialects._hints import message_hint_s
from yieldgate.dialects._ratelimit import quota_readings
from yieldgate.dialects._reply import Reply, ResponseLike, Rule, read_reply
from yieldgate.dialects._servers import server_outcome
from yieldgate.gate import Outcome, current_attempt, default_classify
from yieldgate.gate._outcome import sanitize_hint_s

__all__ = [
    "ANTHROPIC",
    "DIALECTS",
    "GEMINI",
    "GOVERNED_HTTP",
    "HUGGINGFACE",
    "OPENAI",
    "TGI",
    "HttpDialect",
    "ResponseLike",
    "get_dialect",
]


def _base(reply: Reply) -> Outcome:
    status, hint, value = reply.status, reply.hint_s, reply.response
    if reply.retry is False:
        return Outcome.fatal(reply.error(False), reason=f"http {status}", value=value)
    if status == 429:
        return Outcome.yielded(hint, "rate_limited", value=value)
    if status == 529:
        return Outcome.yielded(hint, "overloaded", value=value)
    if status == 503:
        return Outcome.overloaded(hint, reason="unavailable", value=value, error=reply.error(True))
    if status in (408, 409) or status >= 500 or reply.retry is True:
        return Outcome.retryable(
            reply.error(True), hint_s=hint, reason=f"http {status}", value=value
        )
    return Outcome.fatal(reply.error(False), reason=f"http {status}", value=value)


_TOO_LARGE = "Request too large for "
_OVERLOADED = "Model is overloaded"


def _openai_yield(reply: Reply) -> Outcome | None:
    if reply.status == 429 and reply.field("error", "type") == "yield":
        # yieldgate's reference server refusing at its door (saturated, cold): load,
        # not a quota of the model's.
        code = reply.field("error", "code")
        return Outcome.yielded(
            reply.hint_s, code if isinstance(code, str) else "saturated", value=reply.response
        )
    return None


def _openai_429(reply: Reply) -> Outcome | None:
    if reply.status != 429:
        return None
    if "insufficient_quota" in (reply.field("error", "code"), reply.field("error", "type")):
        return Outcome.fatal(reply.error(False), reason="insufficient_quota", value=reply.response)
    message = reply.field("error", "message")
    if isinstance(message, str) and message.startswith(_TOO_LARGE):
        # More than the whole per-minute limit: no wait makes it pass.
        return Outcome.fatal(reply.error(False), reason="request_too_large", value=reply.response)
    if reply.hint_s is None and isinstance(message, str):
        # OpenAI's token limit says the wait only in its message; so may Azure's.
        return Outcome.yielded(message_hint_s(message), "rate_limited", value=reply.response)
    return None


def _anthropic(reply: Reply) -> Outcome | None:
    kind = reply.field("error", "type")
    if kind == "overloaded_error":
        return Outcome.yielded(reply.hint_s, "overloaded", value=reply.response)
    if kind == "rate_limit_error":
        return Outcome.yielded(reply.hint_s, "rate_limited", value=reply.response)
    return None


def _gemini(reply: Reply) -> Outcome | None:
    delay = retry_delay_s(reply.body)
    if delay is not None and (reply.hint_s is None or delay > reply.hint_s):
        reply = replace(reply, hint_s=delay)
    if reply.status == 429 and (spent := spent_quota(reply.body)) is not None:
        return Outcome.fatal(reply.error(False), reason=spent, value=reply.response)
    if delay is None:
        return None
    # The rules that follow, with the body's hint.
    return server_outcome(reply) or _base(reply)


def _hf_loading(reply: Reply) -> Outcome | None:
    if reply.status == 429:
        message = reply.field("error")
        if isinstance(message, str) and message.startswith(_OVERLOADED):
            # TGI's refusal past its max_concurrent_requests, as endpoints relay it:
            # load, not a quota.
            return Outcome.yielded(reply.hint_s, "overloaded", value=reply.response)
        return None
    if reply.status != 503:
        return None
    estimated = sanitize_hint_s(reply.field(ESTIMATED_TIME_FIELD))
    if estimated is not None:
        return Outcome.yielded(estimated, "cold_start", value=reply.response)
    message = reply.field("error")
    if isinstance(message, str) and LOADING_MESSAGE in message:
        return Outcome.yielded(reply.hint_s, "cold_start", value=reply.response)
    return None


def _tgi(reply: Reply) -> Outcome | None:
    if reply.status == 429 and reply.field("error_type") == "overloaded":
        return Outcome.yielded(reply.hint_s, "overloaded", value=reply.response)
    if reply.status == 424 and reply.retry is not False:
        return Outcome.retryable(
            reply.error(True), hint_s=reply.hint_s, reason="generation", value=reply.response
        )
    return None


def _governed_yield(reply: Reply) -> Outcome | None:
    if reply.field("status") != "yield":
        return None
    hint = sanitize_hint_s(reply.field("retry_hint_ms"), unit_s=0.001)
    if hint is None:
        hint = reply.hint_s
    reason = reply.field("reason")
    if not isinstance(reason, str):
        code = reply.field("error", "code")
        reason = code if isinstance(code, str) else "saturated"
    return Outcome.yielded(hint, reason, value=reply.response)


@dataclass(frozen=True, slots=True)
class HttpDialect:
    """The rules of one API family; ``classify`` applies them to a response.

    An instance is also a Gate classifier (``classify(value, error)``), so
    plain httpx calls can use it: ``gate.call(client.post, url, classify=OPENAI)``,
    and so can calls of the official clients, whose exceptions it reads (see
    ``_client_errors``): ``gate.call(openai_client.chat.completions.create, ...,
    classify=OPENAI)``.
    """

    name: str
    rules: tuple[Rule, ...] = ()
    propagate_deadline: bool = False
    # The header that carries one key per call, the same on every attempt and
    # hedge of it, for servers that deduplicate; None where the family has none.
    idempotency_header: str | None = None

    def classify(self, response: ResponseLike) -> Outcome:
        """The Outcome of one response; its body must be loaded unless it is 2xx.

        Inside an attempt, the quota the response's rate-limit headers describe
        is reported to the Gate (``AttemptInfo.report_quota``), whatever the status.
        """
        readings = quota_readings(response.headers)
        if readings:
            attempt = current_attempt()
            if attempt is not None:
                attempt.report_quota(readings)
        status = response.status_code
        if 200 <= status < 300:
            return Outcome.ok(response)
        reply = read_reply(response)
        if reply.retry is False:  # the server's verdict beats every body rule
            return _base(reply)
        for rule in self.rules:
            outcome = rule(reply)
            if outcome is not None:
                return outcome
        return server_outcome(reply) or _base(reply)

    def __call__(self, value: Any, error: BaseException | None) -> Outcome:
        if error is None and _is_response(value):
            return self.classify(value)
        if error is not None:
            # An official client's exception, around a response or about one.
            outcome = client_error_outcome(error, self.classify)
            if outcome is not None:
                return outcome
        return default_classify(value, error)


def _is_response(value: Any) -> bool:
    return isinstance(getattr(value, "status_code", None), int) and hasattr(value, "headers")


OPENAI = HttpDialect(
    "openai", (_openai_yield, daily_refusal, _openai_429), idempotency_header=IDEMPOTENCY_KEY_HEADER
)
"""OpenAI and Azure OpenAI: a spent quota or a request too large is ``fatal``; hints from
429 messages too."""
ANTHROPIC = HttpDialect("anthropic", (daily_refusal, _anthropic))
"""Anthropic: ``overloaded_error`` (529) and ``rate_limit_error`` (429) are yields."""
GEMINI = HttpDialect("gemini", (_gemini,))
"""The Gemini API: ``RetryInfo.retryDelay`` is a hint; a daily (or zero) quota's 429 is
``fatal``, another 429 a yield."""
HUGGINGFACE = HttpDialect("huggingface", (daily_refusal, _hf_loading))
"""HuggingFace endpoints: a 503 for a model still loading is a ``cold_start`` yield."""
TGI = HttpDialect("tgi", (_tgi,))
"""Text Generation Inference: its overloaded 429 is a yield (no hint), a 424 ``retryable``."""
GOVERNED_HTTP = HttpDialect(
    "governed-http",
    (_governed_yield, _hf_loading, _tgi),
    propagate_deadline=True,
    idempotency_header=IDEMPOTENCY_KEY_HEADER,
)
"""yieldgate's reference server over HTTP: its ``yield`` bodies, then HuggingFace's and
TGI's rules; it sends the attempt's remaining time upstream."""

DIALECTS: Mapping[str, HttpDialect] = {
    d.name: d for d in (OPENAI, ANTHROPIC, GEMINI, HUGGINGFACE, TGI, GOVERNED_HTTP)
}
"""Every dialect by its name, as ``get_dialect`` and ``dialect="..."`` arguments take it."""


def get_dialect(dialect: str | HttpDialect) -> HttpDialect:
    """The dialect named ``dialect`` (``openai``, ``anthropic``, ``gemini``, ``huggingface``,
    ``tgi``, ``governed-http``)."""
    if isinstance(dialect, HttpDialect):
        return dialect
    try:
        return DIALECTS[dialect]
    except KeyError:
        known = ", ".join(sorted(DIALECTS))
        raise ValueError(f"unknown dialect {dialect!r}: expected one of {known}") from None

"""HTTP dialects: what a response of one API family means to the Gate.

A dialect turns an HTTP response into an ``Outcome``. Every dialect shares
the rules that the official clients apply (openai-python's among them):

=====================  ===============================================
2xx                    ``ok`` (the body is not read: it may be a stream)
``x-should-retry``     ``false``: ``fatal``; ``true``: retried whatever
                       the status (then ``retryable`` unless congestion)
429                    ``yield``, reason ``rate_limited``
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

- ``openai``: a 429 whose error code is ``insufficient_quota`` is ``fatal``
  (no wait makes a spent quota pass).
- ``huggingface``: a 503 with ``estimated_time`` (or "currently loading") is a
  model still loading: a ``yield`` with reason ``cold_start`` whose hint is
  ``estimated_time``. No official client reads it.
- ``tgi``: a 429 ``error_type: overloaded`` (TGI's ``max_concurrent_requests``)
  is a ``yield`` with reason ``overloaded`` (TGI sends no hint: backoff); a
  424 (the generation failed) is ``retryable``; 422 is ``fatal``.
- ``governed-http`` (yieldgate's reference server, any route): a body with
  ``"status": "yield"`` is a ``yield`` with its ``retry_hint_ms`` and
  ``reason``; then the HuggingFace and TGI rules. It also sends the attempt's
  remaining time upstream (``x-yieldgate-deadline-ms``).

``openai`` and ``governed-http`` send an ``Idempotency-Key`` header, one key
per call and the same on each of its retries and hedges, so that a server
which deduplicates can tell a retry from a new request. HuggingFace's and
TGI's APIs have no such header.

Error bodies are read only for non-2xx responses, and only as JSON; a body
that is not JSON simply matches no body rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from yieldgate._exceptions import RemoteError
from yieldgate._headers import ESTIMATED_TIME_FIELD, IDEMPOTENCY_KEY_HEADER, LOADING_MESSAGE
from yieldgate.dialects._client_errors import client_error_outcome
from yieldgate.dialects._hints import retry_hint_s, should_retry
from yieldgate.gate import Outcome, default_classify
from yieldgate.gate._outcome import sanitize_hint_s

__all__ = [
    "DIALECTS",
    "GOVERNED_HTTP",
    "HUGGINGFACE",
    "OPENAI",
    "TGI",
    "HttpDialect",
    "ResponseLike",
    "get_dialect",
]

_MAX_BODY_PARSE = 1 << 20  # bigger error bodies are not parsed


class ResponseLike(Protocol):
    """What a dialect reads of a response: httpx's and httpx2's ``Response`` both fit.

    ``content`` is only read for non-2xx responses, and must be loaded then.
    """

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class _Reply:
    """One non-2xx response, parsed once for every rule."""

    status: int
    hint_s: float | None
    retry: bool | None
    body: Any  # decoded JSON, or None
    response: ResponseLike

    def error(self, retryable: bool) -> RemoteError:
        detail = _error_message(self.body)
        message = f"HTTP {self.status}" + (f": {detail}" if detail else "")
        return RemoteError(message, code=f"http_{self.status}", retryable=retryable)

    def field(self, *path: str) -> Any:
        value = self.body
        for key in path:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value


Rule = Callable[[_Reply], Outcome | None]


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        if isinstance(error, str):
            return error[:200]
    return ""


def _parse_body(response: ResponseLike) -> Any:
    try:
        content = response.content
    except Exception:  # not loaded: the caller did not read the body
        return None
    if not content or len(content) > _MAX_BODY_PARSE:
        return None
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return None


def _base(reply: _Reply) -> Outcome:
    status, hint, value = reply.status, reply.hint_s, reply.response
    if reply.retry is False:
        return Outcome.fatal(reply.error(False), reason=f"http {status}", value=value)
    if status == 429:
        return Outcome.yielded(hint, "rate_limited", value=value)
    if status == 503:
        return Outcome.overloaded(hint, reason="unavailable", value=value, error=reply.error(True))
    if status in (408, 409) or status >= 500 or reply.retry is True:
        return Outcome.retryable(
            reply.error(True), hint_s=hint, reason=f"http {status}", value=value
        )
    return Outcome.fatal(reply.error(False), reason=f"http {status}", value=value)


def _openai_quota(reply: _Reply) -> Outcome | None:
    if reply.status == 429 and "insufficient_quota" in (
        reply.field("error", "code"),
        reply.field("error", "type"),
    ):
        return Outcome.fatal(reply.error(False), reason="insufficient_quota", value=reply.response)
    return None


def _hf_loading(reply: _Reply) -> Outcome | None:
    if reply.status != 503:
        return None
    estimated = sanitize_hint_s(reply.field(ESTIMATED_TIME_FIELD))
    if estimated is not None:
        return Outcome.yielded(estimated, "cold_start", value=reply.response)
    message = reply.field("error")
    if isinstance(message, str) and LOADING_MESSAGE in message:
        return Outcome.yielded(reply.hint_s, "cold_start", value=reply.response)
    return None


def _tgi(reply: _Reply) -> Outcome | None:
    if reply.status == 429 and reply.field("error_type") == "overloaded":
        return Outcome.yielded(reply.hint_s, "overloaded", value=reply.response)
    if reply.status == 424 and reply.retry is not False:
        return Outcome.retryable(
            reply.error(True), hint_s=reply.hint_s, reason="generation", value=reply.response
        )
    return None


def _governed_yield(reply: _Reply) -> Outcome | None:
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
        """The Outcome of one response; its body must be loaded unless it is 2xx."""
        status = response.status_code
        if 200 <= status < 300:
            return Outcome.ok(response)
        headers = response.headers
        body = _parse_body(response) if self.rules else None
        reply = _Reply(status, retry_hint_s(headers), should_retry(headers), body, response)
        for rule in self.rules:
            outcome = rule(reply)
            if outcome is not None:
                return outcome
        return _base(reply)

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


OPENAI = HttpDialect("openai", (_openai_quota,), idempotency_header=IDEMPOTENCY_KEY_HEADER)
HUGGINGFACE = HttpDialect("huggingface", (_hf_loading,))
TGI = HttpDialect("tgi", (_tgi,))
GOVERNED_HTTP = HttpDialect(
    "governed-http",
    (_governed_yield, _hf_loading, _tgi),
    propagate_deadline=True,
    idempotency_header=IDEMPOTENCY_KEY_HEADER,
)

DIALECTS: Mapping[str, HttpDialect] = {d.name: d for d in (OPENAI, HUGGINGFACE, TGI, GOVERNED_HTTP)}


def get_dialect(dialect: str | HttpDialect) -> HttpDialect:
    """The dialect named ``dialect`` (``openai``, ``huggingface``, ``tgi``, ``governed-http``)."""
    if isinstance(dialect, HttpDialect):
        return dialect
    try:
        return DIALECTS[dialect]
    except KeyError:
        known = ", ".join(sorted(DIALECTS))
        raise ValueError(f"unknown dialect {dialect!r}: expected one of {known}") from None

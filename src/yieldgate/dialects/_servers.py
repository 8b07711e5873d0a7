"""What inference servers send when they refuse or shed work, whatever API they front.

These rules apply in every dialect, after the family's own rules and before
the status rules: a server sends the same refusal on each API it serves (a
vLLM or NVIDIA Dynamo frontend speaks OpenAI, llm-d's endpoint picker fronts
any of them). Each reads a signal that only that server sends, so none of
them can misread another server's reply:

- llm-d's endpoint picker (the Gateway API Inference Extension's, as llm-d
  ships it) names why it dropped a request in ``x-llm-d-request-dropped-reason``:
  ``rejected-*`` (saturated, no endpoints, queue TTL expired, shutting down)
  never reached a model server, a ``yield`` whose reason is the rest of the
  name (``saturated``, ``no_endpoints``, ...); ``evicted*`` was dispatched
  and then killed, ``overloaded`` (work was lost, so its retries spend budget).
  The same picker without the header (the Inference Extension's own, before
  the header) answers in plain text: ``inference error: ResourceExhausted -
  ...`` (a yield, ``saturated``) or ``request evicted by flow control``
  (overloaded, ``evicted``).
- vLLM past ``--max-num-queued-reqs`` (or ``--max-num-queued-tokens``)
  answers 503 whose message says the engine cannot accept new requests: a
  ``yield``, ``queue_full``. Other 503s stay ``overloaded``.
- NVIDIA Dynamo's frontend, when every worker is over its busy threshold,
  answers ``{"message": ..., "type": "Overloaded", "code": ...}`` with the
  status of ``DYN_HTTP_OVERLOAD_STATUS_CODE`` (529 by default): a ``yield``,
  ``overloaded``, whichever status the operator chose.
- Ray Serve past a deployment's ``max_queued_requests`` answers 503 (or the
  429 of its ``BackpressureConfig``) in plain text, "Request dropped due to
  backpressure ...", with a ``Retry-After`` when one is configured: a
  ``yield``, ``backpressure``.

An ``x-should-retry: false`` beats all of them (``HttpDialect.classify``
reads it first): the reply is fatal.
"""

from __future__ import annotations

from typing import Final

from yieldgate._headers import LLM_D_DROPPED_REASON_HEADER
from yieldgate.dialects._reply import Reply
from yieldgate.gate import Outcome

__all__ = ["server_outcome"]

_GAIE_SATURATED: Final = "inference error: ResourceExhausted"
_GAIE_EVICTED: Final = "request evicted by flow control"
_RAY_BACKPRESSURE: Final = "Request dropped due to backpressure"
# The messages of vLLM's QueueOverflowError and MaxQueuedTokensError.
_VLLM_QUEUE_FULL: Final = ("cannot accept new requests", "prefill token backlog limit")


def _llm_d(reply: Reply) -> Outcome | None:
    dropped = reply.header(LLM_D_DROPPED_REASON_HEADER)
    if dropped is None:
        if reply.status == 429 and reply.text.startswith(_GAIE_SATURATED):
            return Outcome.yielded(reply.hint_s, "saturated", value=reply.response)
        if reply.status == 429 and reply.text.startswith(_GAIE_EVICTED):
            return _evicted(reply, "evicted")
        return None
    dropped = dropped.strip().lower()
    if dropped.startswith("rejected-"):
        reason = dropped.removeprefix("rejected-").replace("-", "_")
        return Outcome.yielded(reply.hint_s, reason, value=reply.response)
    if dropped.startswith("evicted"):
        return _evicted(reply, dropped.replace("-", "_"))
    return None


def _evicted(reply: Reply, reason: str) -> Outcome:
    return Outcome.overloaded(
        reply.hint_s, reason=reason, value=reply.response, error=reply.error(True)
    )


def _vllm(reply: Reply) -> Outcome | None:
    if reply.status != 503:
        return None
    message = reply.field("error", "message")
    if isinstance(message, str) and any(text in message for text in _VLLM_QUEUE_FULL):
        return Outcome.yielded(reply.hint_s, "queue_full", value=reply.response)
    return None


def _dynamo(reply: Reply) -> Outcome | None:
    if reply.field("type") == "Overloaded" and isinstance(reply.field("message"), str):
        return Outcome.yielded(reply.hint_s, "overloaded", value=reply.response)
    return None


def _ray_serve(reply: Reply) -> Outcome | None:
    if reply.status in (429, 503) and reply.text.startswith(_RAY_BACKPRESSURE):
        return Outcome.yielded(reply.hint_s, "backpressure", value=reply.response)
    return None


_RULES: Final = (_llm_d, _vllm, _dynamo, _ray_serve)


def server_outcome(reply: Reply) -> Outcome | None:
    """The outcome of a server's own refusal or shedding, or ``None`` if ``reply`` is none."""
    for rule in _RULES:
        outcome = rule(reply)
        if outcome is not None:
            return outcome
    return None

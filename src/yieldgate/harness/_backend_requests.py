"""What a request means to the harness backend, and what the backend answers.

``parse_work`` reads a request (its body is the prompt, as UTF-8 bytes; its
params ``max_tokens``, ``temperature``, ``seed``, ``stop``, ``top_p`` and
``logprobs``) into the engine's prompt and ``SamplingParams``, refusing with a
``BackendError`` (not retryable) what the engine could not serve;
``result_of`` is a finished request's result and ``logprob_entry`` one token's
log-probability, as the result and the stream's chunks carry it. The format
is described in ``backend``; here are its reader and writers, apart from the
backend's threads, lifecycle and admission.
"""

from __future__ import annotations

import math
from typing import Any

from yieldgate.harness._engine_thread import Request
from yieldgate.harness.engine import Engine
from yieldgate.harness.sequence import MAX_TOP_LOGPROBS, SamplingParams, TokenLogprob
from yieldgate.server.backends import BackendError, Work, stop_sequences

__all__ = ["logprob_entry", "parse_work", "result_of"]


def parse_work(
    work: Work, default_max_tokens: int, engine: Engine | None
) -> tuple[list[int], SamplingParams]:
    """``work``'s prompt and sampling; a ``BackendError`` (not retryable) for what the
    engine (once it runs) could not serve."""
    params = work.params
    max_tokens = params.get("max_tokens", default_max_tokens)
    if max_tokens is None:
        max_tokens = default_max_tokens
    if type(max_tokens) is not int or max_tokens < 1:
        raise BackendError("params.max_tokens must be an integer >= 1", retryable=False)
    temperature = params.get("temperature", 0.0)
    if temperature is None:
        temperature = 0.0
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not (temperature >= 0 and math.isfinite(temperature))
    ):
        raise BackendError("params.temperature must be a number >= 0", retryable=False)
    seed = params.get("seed")
    if seed is not None and (type(seed) is not int or not 0 <= seed < 2**63):
        raise BackendError("params.seed must be an integer in [0, 2**63)", retryable=False)
    top_p = params.get("top_p", 1.0)
    if top_p is None:
        top_p = 1.0
    if isinstance(top_p, bool) or not isinstance(top_p, int | float) or not 0 < top_p <= 1:
        raise BackendError("params.top_p must be a number in (0, 1]", retryable=False)
    logprobs = params.get("logprobs")
    if logprobs is not None and (
        type(logprobs) is not int or not 0 <= logprobs <= MAX_TOP_LOGPROBS
    ):
        raise BackendError(
            f"params.logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]", retryable=False
        )
    stop_sequences(work.params)
    prompt = list(work.body.encode("utf-8"))
    if not prompt:
        raise BackendError("the prompt (the request body) is empty", retryable=False)
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=float(temperature),
        seed=seed,
        top_p=float(top_p),
        logprobs=logprobs,
    )
    if engine is not None:
        try:
            engine.check(len(prompt), sampling)
        except ValueError as exc:
            raise BackendError(str(exc), retryable=False) from None
    return prompt, sampling


def result_of(request: Request, text: str, tokens: list[int], finish_reason: str) -> dict[str, Any]:
    """The result of ``request``, finished with ``tokens`` (``text`` their decoded text)."""
    seq = request.seq
    assert seq is not None
    assert request.first_token_at is not None
    ttft_ms = (request.first_token_at - request.started_at) * 1000.0
    e2e_ms = (request.last_token_at - request.started_at) * 1000.0
    tpot_ms = (e2e_ms - ttft_ms) / (len(tokens) - 1) if len(tokens) > 1 else 0.0
    return {
        "text": text,
        "prompt_tokens": len(request.prompt),
        "completion_tokens": len(tokens),
        "prompt_token_ids": request.prompt,
        "token_ids": tokens,
        "cached_tokens": seq.prefix_hit_tokens,
        "ttft_ms": round(ttft_ms, 3),
        "tpot_ms": round(tpot_ms, 3),
        "e2e_ms": round(e2e_ms, 3),
        "preemptions": seq.num_preemptions,
        "finish_reason": finish_reason,
    }


def logprob_entry(request: Request, index: int) -> dict[str, Any]:
    """The ``index``-th output token's log-probability, as the result and chunks carry it.

    Read from the sequence, where the engine thread appended it before it
    posted the token (so it is there by the time the token is).
    """
    assert request.seq is not None
    entry: TokenLogprob = request.seq.logprobs[index]
    return {
        "id": entry.token,
        "logprob": entry.logprob,
        "top": [{"id": token, "logprob": logprob} for token, logprob in entry.top],
    }

"""The dialects read the official clients' exceptions, for code that wraps client calls.

With the real openai and huggingface_hub clients against the reference
server, a wrapped call gets through overload and a cold start: the 429s and
the loading model's 503s are yields with the hints their responses carried.
The text-generation client (which pins huggingface_hub below 1.0, so it
cannot share this environment) is recognised by its class names, checked
with stand-ins of the same names.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from huggingface_hub import AsyncInferenceClient
from huggingface_hub.errors import InferenceTimeoutError

from yieldgate import CallFailedError, Gate, GatePolicy, RetryPolicy
from yieldgate.dialects import HUGGINGFACE, OPENAI, TGI
from yieldgate.gate import OutcomeKind
from yieldgate.server import ServerProcess, spawn

pytestmark = pytest.mark.e2e

MESSAGES: Any = [{"role": "user", "content": "hello"}]


@pytest.fixture
def busy() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "2", "--exec-ms", "50", http=True) as proc:
        yield proc


@pytest.fixture
def cold() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "4", "--exec-ms", "20", "--cold-start-s", "3.0", http=True) as p:
        yield p


def patient() -> Gate:
    return Gate(GatePolicy(retry=RetryPolicy(max_yields=1000)), name="wrapped")


@pytest.mark.anyio
async def test_a_wrapped_openai_call_waits_out_rate_limit_errors(busy: ServerProcess) -> None:
    gate = patient()
    # The client as people build it, its own retries off: the Gate wraps the whole call.
    async with openai.AsyncOpenAI(
        base_url=f"{busy.http_url}/v1", api_key="x", max_retries=0
    ) as client:

        async def one() -> str:
            create = functools.partial(client.chat.completions.create, model="m", messages=MESSAGES)
            reply = await gate.call(create, classify=OPENAI)
            return reply.choices[0].message.content or ""

        replies = await asyncio.gather(*(one() for _ in range(12)))
    assert replies == ["user: hello"] * 12
    stats = gate.statistics()
    assert stats.calls_ok == 12
    assert stats.yields > 0  # the RateLimitErrors, read as yields with their hints
    assert stats.failures == 0


@pytest.mark.anyio
async def test_a_wrapped_huggingface_call_waits_out_a_loading_model(cold: ServerProcess) -> None:
    gate = patient()
    async with AsyncInferenceClient(model=f"{cold.http_url}/models/tiny") as client:
        generate = functools.partial(client.text_generation, "warm up", max_new_tokens=16)
        text = await gate.call(generate, classify=HUGGINGFACE)
    assert text == "warm up"
    stats = gate.statistics()
    assert stats.yields >= 1  # the 503 with estimated_time: a cold start, not a failure
    assert stats.failures == 0


def test_a_client_error_that_is_final_ends_the_call_with_it_as_the_cause(
    busy: ServerProcess,
) -> None:
    gate = patient()
    with openai.OpenAI(base_url=f"{busy.http_url}/v1", api_key="x", max_retries=0) as client:
        create = functools.partial(client.chat.completions.create, model="m", messages="x")
        with pytest.raises(CallFailedError) as caught:
            gate.call_sync(create, classify=OPENAI)
    assert isinstance(caught.value.__cause__, openai.BadRequestError)
    assert gate.statistics().attempts == 1


def test_no_answer_from_a_client_is_retryable() -> None:
    request: Any = object()
    assert OPENAI(None, openai.APIConnectionError(request=request)).kind is OutcomeKind.RETRYABLE
    assert OPENAI(None, openai.APITimeoutError(request=request)).kind is OutcomeKind.RETRYABLE
    timed_out = InferenceTimeoutError("slow")
    assert HUGGINGFACE(None, timed_out).kind is OutcomeKind.RETRYABLE


def _text_generation_error(name: str) -> Exception:
    # A stand-in of text_generation.errors' class of that name (see the module docstring).
    cls = type(name, (Exception,), {"__module__": "text_generation.errors"})
    error: Exception = cls("message")
    return error


@pytest.mark.parametrize(
    ("name", "kind", "reason"),
    [
        ("OverloadedError", OutcomeKind.YIELD, "overloaded"),
        ("RateLimitExceededError", OutcomeKind.YIELD, "rate_limited"),
        ("ShardNotReadyError", OutcomeKind.YIELD, "cold_start"),
        ("ShardTimeoutError", OutcomeKind.RETRYABLE, None),
        ("ValidationError", OutcomeKind.FATAL, None),
        ("BadRequestError", OutcomeKind.FATAL, None),
    ],
)
def test_text_generation_errors(name: str, kind: OutcomeKind, reason: str | None) -> None:
    error = _text_generation_error(name)
    outcome = TGI(None, error)
    assert outcome.kind is kind
    assert outcome.error is error
    if reason is not None:
        assert outcome.reason == reason

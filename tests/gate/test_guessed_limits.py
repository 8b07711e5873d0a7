"""A learnt or guessed limit paces; it never refuses a request (issue 40, defect 1).

Only the provider says a request is too large. On main before this, Azure's
remaining-only headers taught a limit without the answered request's own cost
(8,000 TPM read as 3,000 after a 5,000-token answer), and one answer with a token
limit of 1 taught a limit of 1: every later call raised ``RequestTooLargeError``
client-side, forever, and nothing was sent to correct it.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import httpx
import pytest

from tests.gate.test_quota import Provider, gate_for
from yieldgate import Cost, RequestTooLargeError
from yieldgate.dialects import OPENAI

pytestmark = pytest.mark.anyio


def azure(provider: Provider) -> Callable[[int], httpx.Response]:
    """The provider as an Azure deployment answers: what remains, never the limit."""

    def admit(tokens: int) -> httpx.Response:
        response = provider.admit(tokens)
        kept = {k: v for k, v in response.headers.items() if "-limit-" not in k}
        return httpx.Response(response.status_code, content=response.content, headers=kept)

    return admit


async def test_azure_remaining_only_headers_never_refuse_a_request_that_fits() -> None:
    provider = Provider(anyio.current_time, tpm=8_000, rpm=10_000, window_s=60.0)
    admit = azure(provider)
    gate = gate_for(anyio.current_time)
    outcomes: list[object] = []
    start = anyio.current_time()
    for _ in range(4):  # one after another, as a script calls

        async def attempt() -> httpx.Response:
            await anyio.sleep(0.2)
            return admit(5_000)

        try:
            response = await gate.call(attempt, cost=Cost.of(5_000, 0), classify=OPENAI)
        except RequestTooLargeError as exc:  # on main: calls 1, 2 and 3, in 0.02 s
            outcomes.append(exc)
        else:
            outcomes.append(response.status_code)
    assert outcomes == [200] * 4
    # Paced, not bounced: each waits for the deployment's bucket to hold 5,000 again.
    assert provider.refused == 0
    # The bound: what is past the first full bucket, at the refill rate (90 s).
    bound = (4 * 5_000 - 8_000) / (8_000 / 60)
    assert anyio.current_time() - start <= 1.1 * bound
    assert gate._core.audit() == []


async def test_one_answer_with_a_limit_of_one_token_refuses_nothing() -> None:
    provider = Provider(anyio.current_time, tpm=1_000_000, rpm=100_000, window_s=60.0)
    answers = 0

    async def attempt() -> httpx.Response:
        nonlocal answers
        await anyio.sleep(0.1)
        response = provider.admit(100)
        answers += 1
        if answers == 1:  # a proxy's bad header, once
            headers = {**response.headers, "x-ratelimit-limit-tokens": "1"}
            return httpx.Response(200, content=response.content, headers=headers)
        return response

    gate = gate_for(anyio.current_time)
    await gate.call(attempt, cost=Cost.of(100, 0), classify=OPENAI)  # the bad answer
    results: list[object] = []

    async def one() -> None:
        try:
            results.append(await gate.call(attempt, cost=Cost.of(100, 0), classify=OPENAI))
        except Exception as exc:  # on main: RequestTooLargeError, every one
            results.append(exc)

    start = anyio.current_time()
    async with anyio.create_task_group() as tg:
        for _ in range(40):
            tg.start_soon(one)
    assert [getattr(r, "status_code", r) for r in results] == [200] * 40
    # The bad limit paced one call for its whole bucket (a minute of a 1-token
    # limit); that call's answer, the real limit, released the rest.
    assert anyio.current_time() - start <= 61.0
    assert gate._core.audit() == []

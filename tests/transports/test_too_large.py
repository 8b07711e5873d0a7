"""A request larger than the quota, through the official openai client (issue 40, defect
5): docs/recipes/quotas.md said it reaches openai users as ``APIConnectionError``; that is
openai 2.x. With openai 3.x the ``RequestTooLargeError`` propagates as itself. Nothing is
sent either way: the base URL is a port nobody listens on."""

from __future__ import annotations

import openai
import pytest

import yieldgate
from yieldgate import Gate, GatePolicy, QuotaPolicy, RequestTooLargeError

pytestmark = pytest.mark.anyio

MESSAGES: list[dict[str, str]] = [{"role": "user", "content": "hi"}]
OPENAI_3 = int(openai.__version__.split(".")[0]) >= 3


def too_large(raised: BaseException) -> RequestTooLargeError:
    if OPENAI_3:
        assert isinstance(raised, RequestTooLargeError), repr(raised)
        return raised
    assert isinstance(raised, openai.APIConnectionError), repr(raised)
    assert isinstance(raised.__cause__, RequestTooLargeError), repr(raised.__cause__)
    return raised.__cause__


async def test_a_request_over_the_whole_quota_fails_at_once_as_the_recipe_says() -> None:
    gate = Gate(GatePolicy(quota=QuotaPolicy(tokens_per_minute=100)), name="too-large")
    client = yieldgate.openai_client(gate, base_url="http://127.0.0.1:9/v1", api_key="x")
    async with client:
        with pytest.raises(Exception) as raised:  # noqa: PT011 - which class: see too_large
            await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5000)
    error = too_large(raised.value)
    assert (error.resource, error.limit) == ("tokens", 100)
    assert gate.statistics().attempts == 0


def test_the_sync_client_too() -> None:
    gate = Gate(GatePolicy(quota=QuotaPolicy(tokens_per_minute=100)), name="too-large-sync")
    client = yieldgate.openai_client(gate, sync=True, base_url="http://127.0.0.1:9/v1", api_key="x")
    with client, pytest.raises(Exception) as raised:  # noqa: PT011 - see too_large
        client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=5000)
    too_large(raised.value)
    assert gate.statistics().attempts == 0

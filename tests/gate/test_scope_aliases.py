"""One quota, two names (issue 40, "Scope aliases").

OpenAI answers a request for ``gpt-4o`` as ``gpt-4o-2024-08-06`` and meters both
names as one quota. A Gate that keeps the quota per model kept two scopes, each
paced as if it had the whole quota: 28 429s in the issue's run. The answer's
``model`` field now settles it (a snapshot of the model requested is metered as
that model), and ``QuotaPolicy.aliases`` names what no answer says.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any

import anyio
import anyio.lowlevel
import httpx
import pytest

import yieldgate
from tests.gate.test_quota import Provider
from yieldgate import Cost, Gate, GatePolicy, QuotaPolicy
from yieldgate.gate import NullInstrumentation

pytestmark = pytest.mark.anyio

SNAPSHOT = "gpt-4o-2024-08-06"


def handler(provider: Provider, answered: str) -> Any:
    """The provider's chat route: one quota whatever the name, answered as ``answered``."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        tokens = math.ceil(len(body["messages"][0]["content"]) / 4) + body["max_tokens"]
        response = provider.admit(tokens)
        if response.status_code != 200:
            return response
        answer = {"id": "x", "object": "chat.completion", "model": answered, "choices": []}
        return httpx.Response(200, json=answer, headers=response.headers)

    return handle


async def burst(gate: Gate, provider: Provider, names: list[str], answered: str) -> float:
    client = yieldgate.http_client(
        gate, inner=httpx.MockTransport(handler(provider, answered)), base_url="http://p"
    )
    rng = random.Random(5)

    async def one(model: str) -> None:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "x" * rng.choice((40, 400))}],
            "max_tokens": rng.choice((16, 128)),
        }
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200

    start = anyio.current_time()
    async with client, anyio.create_task_group() as tg:
        for model in names:
            tg.start_soon(one, model)
    return anyio.current_time() - start


async def test_a_snapshot_named_in_the_answer_shares_the_requested_models_quota() -> None:
    provider = Provider(anyio.current_time, tpm=6_000, rpm=100_000, window_s=60.0)
    gate = Gate(GatePolicy(), instrumentation=NullInstrumentation())
    # Half the calls name the alias, half the snapshot: one quota, two names.
    names = ["gpt-4o", SNAPSHOT] * 40
    await burst(gate, provider, names, answered=SNAPSHOT)
    # On main: two scopes, each paced as if it had the whole quota (25 429s here).
    assert provider.refused <= 0.02 * len(names), provider.refused
    assert gate._core.aliases == {SNAPSHOT: "gpt-4o"}
    assert gate._core.audit() == []


async def test_an_answer_naming_another_model_is_no_alias() -> None:
    provider = Provider(anyio.current_time, tpm=1_000_000, rpm=100_000, window_s=60.0)
    gate = Gate(GatePolicy(), instrumentation=NullInstrumentation())
    # An Azure deployment, a router: the answer names a model that is not a snapshot.
    await burst(gate, provider, ["my-deployment", "gpt-4o"], answered="gpt-4o-mini-2024-07-18")
    assert gate._core.aliases == {}


async def test_the_callers_aliases_name_one_quota() -> None:
    provider = Provider(anyio.current_time, tpm=6_000, rpm=100_000, window_s=60.0)
    policy = GatePolicy(quota=QuotaPolicy(aliases={"deployment-b": "deployment-a"}))
    gate = Gate(policy, instrumentation=NullInstrumentation())
    names = ["deployment-a", "deployment-b"] * 40
    await burst(gate, provider, names, answered="some-model")
    assert provider.refused <= 0.02 * len(names), provider.refused
    # A call given its cost directly is in its alias's scope too.
    await gate.call(lambda: anyio.lowlevel.checkpoint(), cost=Cost(1, 10, 10, 0, "deployment-b"))
    assert gate._core.audit() == []


def test_aliases_are_kept_as_sorted_pairs_and_checked() -> None:
    policy = QuotaPolicy(aliases={"b": "x", "a": "x"})
    assert policy.aliases == (("a", "x"), ("b", "x"))
    assert QuotaPolicy(aliases=policy.aliases) == policy
    with pytest.raises(TypeError, match="aliases must map"):
        QuotaPolicy(aliases={"a": 1})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("requested", "answered", "alias"),
    [
        ("gpt-4o", "gpt-4o-2024-08-06", True),
        ("gpt-4", "gpt-4-0613", True),
        ("claude-sonnet-4-5", "claude-sonnet-4-5-20250929", True),
        ("mistral-large-latest", "mistral-large-2411", True),
        ("gpt-4o", "gpt-4o-mini-2024-07-18", False),  # another model of the family
        ("gpt-4o", "gpt-4o", False),
        ("", "gpt-4o-2024-08-06", False),
        ("my-deployment", "gpt-4o-2024-08-06", False),
    ],
)
def test_which_answers_are_snapshots(requested: str, answered: str, alias: bool) -> None:
    core = Gate(GatePolicy())._core
    core.aliases.learn(requested, answered)
    assert core.aliases == ({answered: requested} if alias else {})

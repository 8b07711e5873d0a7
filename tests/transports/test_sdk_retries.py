"""The wrapped official clients keep their own retries off, whatever asks for them.

``openai_client`` and ``anthropic_client`` accept ``max_retries=0`` (what they
set anyway) and refuse any other number. ``client.with_options(max_retries=N)``,
which frameworks call on a client they are given, is neutralised: the copy
keeps the SDK's retries at 0, and the first such call of the process warns.
Attempts are counted by the Gate against a port nobody listens on: each of
the SDK's retries would be one more Gate call.
"""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

import yieldgate
from yieldgate import GatePolicy, RetryPolicy
from yieldgate.transports import _clients

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(autouse=True)
def _warn_again() -> Iterator[None]:
    """Each test sees the once-per-process warning afresh."""
    saved = set(_clients._WARNED)
    _clients._WARNED.clear()
    yield
    _clients._WARNED.clear()
    _clients._WARNED.update(saved)


def one_attempt_gate() -> yieldgate.Gate:
    return yieldgate.Gate(GatePolicy(retry=RetryPolicy(max_attempts=1)))


def openai_call(client: Any) -> Any:
    return client.chat.completions.create(model="m", messages=MESSAGES)


def anthropic_call(client: Any) -> Any:
    return client.messages.create(model="m", max_tokens=8, messages=MESSAGES)


SDKS = [
    pytest.param(yieldgate.openai_client, openai_call, "/v1", id="openai"),
    pytest.param(yieldgate.anthropic_client, anthropic_call, "", id="anthropic"),
]
# What each SDK raises when the Gate gives up on a refused connection.
REFUSED = (openai.APIConnectionError, anthropic.APIConnectionError)


def send(call: Any, client: Any, sync: bool) -> None:
    if sync:
        call(client)
    else:
        asyncio.run(call(client))


@pytest.mark.parametrize(("make", "call", "path"), SDKS)
def test_max_retries_zero_is_accepted_and_any_other_refused(
    make: Any, call: Any, path: str, refused_url: str
) -> None:
    gate = one_attempt_gate()
    client = make(gate, base_url=refused_url + path, api_key="k", max_retries=0)
    assert client.max_retries == 0
    with pytest.raises(REFUSED):
        send(call, client, sync=False)
    assert (gate.statistics().calls, gate.statistics().attempts) == (1, 1)
    with pytest.raises(TypeError, match=r"sets max_retries=0 itself, got 3: the Gate retries"):
        make(gate, api_key="k", max_retries=3)


@pytest.mark.parametrize(("make", "call", "path"), SDKS)
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
def test_with_options_max_retries_is_neutralised_with_one_warning(
    make: Any, call: Any, path: str, sync: bool, refused_url: str
) -> None:
    gate = one_attempt_gate()
    client = make(gate, sync=sync, base_url=refused_url + path, api_key="k")
    with pytest.warns(RuntimeWarning, match=r"max_retries=3 ignored: a yieldgate .* client"):
        retrying = client.with_options(max_retries=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: not again
        again = client.copy(max_retries=5).with_options(timeout=5.0)
    for each in (retrying, again):
        assert each.max_retries == 0
        with pytest.raises(REFUSED):
            send(call, each, sync)
    # One Gate call per request: the SDK did not retry under the Gate.
    stats = gate.statistics()
    assert (stats.calls, stats.attempts) == (2, 2)

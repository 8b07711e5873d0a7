"""A burst through a default Gate and the provider's official client, for every provider.

Every provider of ``providers.specs``: ``CALLS`` chat completions fired at once through
``AsyncOpenAI`` (``AsyncAnthropic`` for Anthropic) on ``yieldgate.http_client(Gate())``,
the burst half again the provider's binding quota. Where the provider says its quota
in headers, at most 2% of the attempts may meet a 429; everywhere, every call succeeds
(no client-side refusal, no spent-quota error) and the burst ends near the quota's
bound: what is past the first full bucket, at its refill rate (no stall).
"""

from __future__ import annotations

import time

import anyio
import httpx2
import pytest

import yieldgate
from tests.zoo import providers
from tests.zoo.burst import bound_s, fire, jobs, official, zoo
from tests.zoo.providers import Fake, Spec
from yieldgate import Gate

pytestmark = pytest.mark.anyio

CALLS = 60
BURST = jobs(CALLS, seed=7)


async def burst(spec: Spec) -> tuple[Fake, list[BaseException], float]:
    """``BURST`` through a default Gate and the provider's official client: its fake,
    the errors and the makespan."""
    fake = Fake(spec, anyio.current_time, httpx2)
    gate = Gate(name=f"zoo-{spec.name}")
    inner = httpx2.MockTransport(fake.handle)
    client = official(
        spec, yieldgate.http_client(gate, dialect=spec.dialect, inner=inner), max_retries=0
    )
    try:
        errors, makespan = await fire(spec, client, BURST)
    finally:
        await client.close()
        await gate.aclose()
    return fake, errors, makespan


@pytest.mark.parametrize("spec", zoo(BURST), ids=lambda spec: spec.name)
async def test_a_burst_through_a_default_gate(spec: Spec) -> None:
    fake, errors, makespan = await burst(spec)
    assert errors == [], errors[:3]
    assert fake.served == CALLS
    bound = bound_s(spec, BURST)
    if spec.sends_quota:
        assert fake.refused <= 0.02 * CALLS, (fake.refused, makespan, bound)
        assert makespan <= 1.25 * bound, (makespan, bound, fake.refused)
    else:  # the window and the hints alone
        assert makespan <= 2.0 * bound, (makespan, bound, fake.refused)


@pytest.mark.parametrize("skew_s", [-2.0, -0.3, -0.02, 0.3, 2.0])
@pytest.mark.parametrize("name", ["anthropic", "openrouter"])
async def test_resets_on_the_wall_clock_pace_as_well_when_the_clocks_disagree(
    name: str, skew_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anthropic's resets are RFC 3339 times and OpenRouter's epoch milliseconds: read
    on a client whose clock is ``skew_s`` behind the provider's, they are off by that
    much. Pacing must not hang on them (a 20 ms skew once cost Anthropic 3 429s in 60)."""
    monkeypatch.setattr(providers, "wall", lambda: time.time() + skew_s)
    (spec,) = [spec for spec in zoo(BURST) if spec.name == name]
    fake, errors, makespan = await burst(spec)
    assert errors == [], errors[:3]
    assert fake.refused <= 0.02 * CALLS, (fake.refused, makespan)
    assert makespan <= 1.25 * bound_s(spec, BURST), (makespan, fake.refused)

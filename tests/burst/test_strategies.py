"""Strategies: policies from presets and files, labels, what the baselines retry."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

import yieldgate
from yieldgate.burst import Strategy, load_policy
from yieldgate.burst import _strategies as strategies
from yieldgate.burst._strategies import compared_names
from yieldgate.burst._targets import Request, error_kind, retry_signal


def test_presets_by_name() -> None:
    policy, label = load_policy("cold_start")
    assert policy == yieldgate.GatePolicy.cold_start()
    assert label == "cold_start"
    assert load_policy("cold-start")[0] == policy
    assert load_policy("default")[0] == yieldgate.GatePolicy()


def test_policy_file(tmp_path: Path) -> None:
    path = tmp_path / "ramp.json"
    path.write_text(
        json.dumps(
            {
                "preset": "cold_start",
                "preset_args": {"max_concurrency": 32},
                "window": {"initial": 2},
                "rate": {"per_s": 20, "ramp_from_per_s": 1, "ramp_s": 5},
            }
        )
    )
    policy, label = load_policy(str(path))
    assert label == "ramp"
    assert policy.window.initial == 2
    assert policy.window.max == 32
    assert policy.retry == yieldgate.GatePolicy.cold_start().retry
    assert policy.rate == yieldgate.RatePolicy(per_s=20, ramp_from_per_s=1, ramp_s=5)
    strategy = Strategy.parse("yieldgate", policy=str(path))
    assert strategy.label == "yieldgate (ramp)"
    assert strategy.make_gate().policy == policy


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"windows": {}}, "unknown keys"),
        ({"preset": "fast"}, "unknown preset"),
        ({"window": {"initial": 0}}, "initial"),
        ({"window": {"size": 3}}, "unknown fields"),
        ({"window": 3}, "must be an object"),
        ([1, 2], "expected a JSON object"),
    ],
)
def test_bad_policy_files(tmp_path: Path, document: object, message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError, match=message):
        load_policy(str(path))


def test_missing_policy_file() -> None:
    with pytest.raises(ValueError, match="neither a preset"):
        load_policy("/nonexistent/policy.json")


def test_strategy_names_and_gates() -> None:
    assert Strategy(name="yieldgate").label == "yieldgate"
    with pytest.raises(ValueError, match="unknown strategy"):
        Strategy(name="hope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only the yieldgate"):
        Strategy(name="naive", policy=yieldgate.GatePolicy())
    # The baselines' Gate only carries: one attempt, no limit, no breaker.
    gate = Strategy(name="tenacity").make_gate()
    assert gate.policy.retry == yieldgate.RetryPolicy.no_retry()
    assert not gate.policy.breaker.enabled
    # The official openai client does its own retrying on its own target only.
    assert Strategy(name="openai-default").native_retries("openai") == 2
    assert Strategy(name="openai-default").native_retries("tcp") == 0
    assert Strategy(name="tenacity").native_retries("openai") == 0
    # ... and so does anthropic's, on its own.
    assert Strategy(name="anthropic-default").native_retries("anthropic") == 2
    assert Strategy(name="anthropic-default").native_retries("openai") == 0
    assert Strategy(name="openai-default").native_retries("anthropic") == 0


@pytest.mark.parametrize(
    ("name", "kind", "slept"),
    [
        # openai's client sleeps a hint of up to 120 s exactly, else its own backoff...
        ("openai-default", "tcp", [1.5, None]),
        # ... anthropic's any hint; both back off 0.5 s, then 1 s, jittered down by < 25%.
        ("anthropic-default", "tcp", [1.5, 150.0]),
        ("anthropic-default", "openai", [1.5, 150.0]),
    ],
)
@pytest.mark.anyio
async def test_the_official_rules_around_another_client(
    monkeypatch: pytest.MonkeyPatch, name: str, kind: str, slept: list[float | None]
) -> None:
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    monkeypatch.setattr(strategies, "anyio", SimpleNamespace(sleep=sleep))
    hints = iter([1.5, 150.0, None])
    sent: list[str] = []

    async def send(prompt: str, request: Request) -> None:
        sent.append(prompt)
        hint = next(hints)
        if hint is not None:
            raise yieldgate.YieldExhaustedError("saturated", attempts=1, last_hint_s=hint)

    wrapped = Strategy(name=name).wrap(send, kind, seed=1)  # type: ignore[arg-type]
    await wrapped("p", Request(index=0, arrival_s=0.0))
    assert sent == ["p"] * 3  # two retries
    assert sleeps[0] == 1.5
    if slept[1] is None:
        assert 0.75 < sleeps[1] <= 1.0  # 1 s, jittered: 150 s is past openai's cap
    else:
        assert sleeps[1] == slept[1]


@pytest.mark.anyio
async def test_an_official_client_on_its_own_target_is_not_wrapped() -> None:
    async def send(prompt: str, request: Request) -> None:
        raise AssertionError("not called")

    assert Strategy(name="anthropic-default").wrap(send, "anthropic", seed=1) is send
    assert Strategy(name="openai-default").wrap(send, "openai", seed=1) is send
    assert Strategy(name="anthropic-default").wrap(send, "openai", seed=1) is not send


def test_what_the_baselines_retry() -> None:
    exhausted = yieldgate.YieldExhaustedError("saturated", attempts=1, last_hint_s=0.25)
    assert retry_signal(exhausted) == (True, 0.25)
    assert error_kind(exhausted) == "YieldExhaustedError"
    # The Gate's verdict rides on a response the client raised about (openai, hf).
    response = httpx.Response(429, extensions={"yieldgate_error": exhausted})
    wrapped = RuntimeError("rate limited")
    wrapped.response = response  # type: ignore[attr-defined]
    assert retry_signal(wrapped) == (True, 0.25)
    assert error_kind(wrapped) == "YieldExhaustedError"
    # ... or is the cause of the client's own error.
    try:
        try:
            raise yieldgate.RetriesExhaustedError("reset", attempts=1)
        except yieldgate.YieldgateError as exc:
            raise ConnectionError("connection error") from exc
    except ConnectionError as outer:
        assert retry_signal(outer) == (True, None)
    fatal = yieldgate.CallFailedError("bad request", attempts=1)
    assert retry_signal(fatal) == (False, None)
    plain = RuntimeError("?")
    plain.response = httpx.Response(500)  # type: ignore[attr-defined]
    assert error_kind(plain) == "HTTP 500"
    assert error_kind(ValueError()) == "ValueError"


def test_compare_runs_anthropics_policy_only_against_its_own_client() -> None:
    four = ("yieldgate", "naive", "tenacity", "openai-default")
    assert compared_names("openai") == four
    assert compared_names("tcp") == four
    assert compared_names("anthropic") == (*four, "anthropic-default")

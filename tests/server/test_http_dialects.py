"""Request parsing and bodies of the HTTP dialects, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from yieldgate.protocol import YieldReason
from yieldgate.server._http_dialect_base import text_token_id, tokens_of
from yieldgate.server._http_dialects import (
    BadRequest,
    ChatCompletions,
    Completions,
    HfModels,
    Job,
    TgiGenerate,
    dumps,
    generated,
    loads,
    retry_after_s,
)
from yieldgate.server.backends import BackendError
from yieldgate.server.governor import Yield


def test_chat_prompt_and_params() -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "rules"},
            {"role": "assistant", "content": None},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
        ],
        "max_completion_tokens": 9,
        "temperature": 0,
        "seed": 0,
        "backend_params": {"exec_ms": 3},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    job = ChatCompletions().parse(body, None, "default")
    assert job.prompt == "system: rules\nassistant: \nuser: ab"
    assert job.params == {"max_tokens": 9, "temperature": 0, "seed": 0, "exec_ms": 3}
    assert (job.stream, job.include_usage, job.model) == (True, True, "m")


def test_the_model_defaults_to_the_configured_one() -> None:
    job = Completions().parse({"prompt": "x"}, None, "sim")
    assert (job.model, job.params, job.stream) == ("sim", {}, False)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"content": "no role"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"messages": [{"role": "user", "content": 3}]},
        {"messages": [{"role": "user", "content": "x"}], "n": 2},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
        {"messages": [{"role": "user", "content": "x"}], "max_tokens": True},
        {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"},
        {"messages": [{"role": "user", "content": "x"}], "seed": -1},
        {"messages": [{"role": "user", "content": "x"}], "seed": 1.5},
        {"messages": [{"role": "user", "content": "x"}], "stream": "yes"},
        {"messages": [{"role": "user", "content": "x"}], "stream_options": []},
    ],
)
def test_chat_rejects(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequest):
        ChatCompletions().parse(body, None, "m")


@pytest.mark.parametrize("prompt", [["a", "b"], [], 3, None, [3]])
def test_completions_take_one_prompt(prompt: Any) -> None:
    with pytest.raises(BadRequest, match="prompt"):
        Completions().parse({"prompt": prompt}, None, "m")


def test_tgi_parameters() -> None:
    body = {
        "inputs": "x",
        "parameters": {
            "max_new_tokens": 4,
            "temperature": 0.5,
            "seed": 11,
            "backend_params": {"chunks": 2},
        },
        "stream": True,
    }
    assert TgiGenerate(stream=False).parse(body, None, "m").stream is False
    assert TgiGenerate(stream=None).parse(body, None, "m").stream is True
    job = HfModels().parse(body, "org/model", "m")
    assert (job.model, job.stream) == ("org/model", True)
    assert job.params == {"max_tokens": 4, "temperature": 0.5, "seed": 11, "chunks": 2}
    with pytest.raises(BadRequest, match=r"parameters\.max_new_tokens"):
        HfModels().parse({"inputs": "x", "parameters": {"max_new_tokens": "4"}}, "m", "m")


def test_loads_and_dumps() -> None:
    assert loads(b'{"a": 1}') == {"a": 1}
    for raw in (b"", b"\xff", b"[]", b"Infinity", b'{"a": -Infinity}', b"[" * 100_000):
        with pytest.raises(BadRequest):
            loads(raw)
    assert dumps({"s": "\ud800"}) == b'{"s":"\\ud800"}'
    with pytest.raises(ValueError, match="JSON"):
        dumps(float("nan"))


def _job(prompt: str = "two words") -> Job:
    return Job(prompt=prompt, params={}, stream=False, model="m")


def test_generated_reads_a_backend_result() -> None:
    done = generated(_job(), {"text": "a"})
    assert (done.text, done.finish_reason, done.token_ids) == ("a", "eos", None)
    assert done.usage == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    assert generated(_job(), "bare").text == "bare"
    done = generated(
        _job(),
        {
            "text": "a",
            "prompt_tokens": 3,
            "completion_tokens": -1,
            "finish_reason": "length",
            "token_ids": [97],
        },
    )
    assert (done.usage["prompt_tokens"], done.usage["completion_tokens"]) == (3, 1)
    assert (done.finish_reason, done.token_ids) == ("length", (97,))
    assert generated(_job(), {"text": "a", "finish_reason": "odd"}).finish_reason == "eos"
    for bad in ({"text": 3}, [1], None):
        with pytest.raises(BackendError):
            generated(_job(), bad)


def test_tokens_are_byte_ids_or_stable_word_ids() -> None:
    # A byte-level vocabulary: "é" is two bytes, the first carries no text yet.
    assert tokens_of("aé", (97, 0xC3, 0xA9)) == [(97, "a"), (0xC3, ""), (0xA9, "é")]
    words = tokens_of(" one two  ", None)
    assert [text for _, text in words] == [" one", " two  "]
    assert [i for i, _ in words] == [text_token_id(" one"), text_token_id(" two  ")]
    assert tokens_of("", None) == []


def test_retry_after_rounds_up() -> None:
    assert [retry_after_s(ms) for ms in (0, 1, 1000, 1001, 2500)] == [0, 1, 1, 2, 3]


def test_only_the_hf_route_has_a_cold_start_answer() -> None:
    cold = Yield(retry_hint_ms=1500, reason=YieldReason.COLD_START, inflight=0, max_inflight=2)
    busy = Yield(retry_hint_ms=1500, reason=YieldReason.SATURATED, inflight=2, max_inflight=2)
    job = HfModels().parse({"inputs": "x"}, "gpt2", "m")
    assert HfModels().cold_start(job, cold) == {
        "error": "Model gpt2 is currently loading",
        "estimated_time": 1.5,
    }
    assert HfModels().cold_start(job, busy) is None
    assert TgiGenerate(stream=False).cold_start(job, cold) is None

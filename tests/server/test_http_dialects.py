"""Request parsing and bodies of the HTTP dialects, without a server."""

from __future__ import annotations

from typing import Any

import pytest

from yieldgate.protocol import YieldReason
from yieldgate.server._http_dialect_base import text_token_ids, tokens_of
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


@pytest.mark.parametrize(
    ("parameters", "param"),
    [
        ({"top_k": 10}, "top_k"),
        ({"typical_p": 0.5}, "typical_p"),
        ({"repetition_penalty": 1.2}, "repetition_penalty"),
        ({"frequency_penalty": 0.5}, "frequency_penalty"),
        ({"truncate": 5}, "truncate"),
        ({"best_of": 2}, "best_of"),
        ({"watermark": True}, "watermark"),
        ({"top_n_tokens": 3}, "top_n_tokens"),
        ({"grammar": {"type": "json", "value": {}}}, "grammar"),
        ({"adapter_id": "lora"}, "adapter_id"),
        ({"top_p": True}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_tgi_refuses_what_no_backend_honours(parameters: dict[str, Any], param: str) -> None:
    body = {"inputs": "x", "parameters": parameters}
    for dialect in (TgiGenerate(stream=False), HfModels()):
        with pytest.raises(BadRequest) as caught:
            dialect.parse(body, None, "m")
        assert caught.value.param == f"parameters.{param}"
    # What the TGI route answers for it: 422, TGI's validation error.
    assert TgiGenerate.invalid_status == 422
    assert TgiGenerate(stream=False).error(422, "bad_frame", "")["error_type"] == "validation"


def test_tgi_passes_top_p_on_for_a_backend_that_honours_it() -> None:
    body = {"inputs": "x", "parameters": {"top_p": 0.9}}
    for dialect in (TgiGenerate(stream=False), HfModels()):
        assert dialect.parse(body, None, "m").params["top_p"] == 0.9
    neutral = {"inputs": "x", "parameters": {"top_p": 1}}
    assert "top_p" not in TgiGenerate(stream=False).parse(neutral, None, "m").params


def test_tgi_accepts_what_clients_send_by_default() -> None:
    # text-generation 0.7 sends every field; None, false and the neutral values ask for nothing.
    parameters = {
        "best_of": None,
        "details": True,
        "decoder_input_details": False,
        "do_sample": False,
        "max_new_tokens": 20,
        "repetition_penalty": None,
        "frequency_penalty": None,
        "return_full_text": False,
        "seed": None,
        "stop": [],
        "temperature": None,
        "top_k": None,
        "top_p": None,
        "truncate": None,
        "typical_p": None,
        "watermark": False,
        "top_n_tokens": None,
        "grammar": None,
    }
    job = TgiGenerate(stream=True).parse({"inputs": "x", "parameters": parameters}, None, "m")
    assert (job.params, job.details, job.return_full_text) == ({"max_tokens": 20}, True, False)
    neutral = {"top_p": 1.0, "typical_p": 1, "repetition_penalty": 1.0, "frequency_penalty": 0}
    neutral |= {"best_of": 1, "top_n_tokens": 0}
    assert TgiGenerate(stream=False).parse({"inputs": "x", "parameters": neutral}, None, "m")


def test_tgi_sampling_follows_do_sample() -> None:
    def temperature(**parameters: Any) -> Any:
        job = TgiGenerate(stream=False).parse({"inputs": "x", "parameters": parameters}, None, "m")
        return job.params.get("temperature")

    assert temperature() is None  # greedy
    assert temperature(do_sample=True) == 1.0
    assert temperature(do_sample=True, temperature=0.5) == 0.5
    assert temperature(temperature=0.5) == 0.5  # changed logits sample, as in TGI
    assert temperature(temperature=1.0) is None  # unchanged logits and no do_sample: greedy


def test_tgi_prefill_details_are_refused_in_a_stream() -> None:
    parameters = {"details": True, "decoder_input_details": True}
    body = {"inputs": "x", "parameters": parameters}
    assert TgiGenerate(stream=False).parse(body, None, "m").prefill_details
    with pytest.raises(BadRequest, match="streaming"):
        TgiGenerate(stream=True).parse(body, None, "m")


def test_tgi_return_full_text_puts_the_prompt_first() -> None:
    dialect = TgiGenerate(stream=False)
    job = dialect.parse({"inputs": "ab", "parameters": {"return_full_text": True}}, None, "m")
    done = generated(job, {"text": "c"})
    assert dialect.ok(job, done) == {"generated_text": "abc"}
    assert done.usage["completion_tokens"] == 1


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
    # No counts from the backend: the UTF-8 bytes of the prompt and of the text.
    done = generated(_job("two wörds"), {"text": "añ"})
    assert (done.text, done.finish_reason, done.token_ids) == ("añ", "eos", None)
    assert done.usage == {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
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


def test_tokens_are_utf8_bytes() -> None:
    # A byte-level vocabulary: "é" is two bytes, the first carries no text yet.
    assert tokens_of("aé", (97, 0xC3, 0xA9)) == [(97, "a"), (0xC3, ""), (0xA9, "é")]
    # Without the backend's ids, the text's own bytes: the same tokens.
    assert tokens_of("aé", None) == tokens_of("aé", text_token_ids("aé"))
    assert text_token_ids(" a\n") == (32, 97, 10)
    assert text_token_ids("\ud800") == (0xED, 0xA0, 0x80)  # a lone surrogate, as JSON allows
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

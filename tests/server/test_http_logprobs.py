"""Per-token log-probabilities: reading a backend's, and the OpenAI routes' fields and shapes."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.completion import Completion
from openai.types.completion_choice import Logprobs

from yieldgate.server._http_dialects import (
    BadRequest,
    ChatCompletions,
    Completions,
    Generated,
    Job,
    TgiGenerate,
    generated,
)
from yieldgate.server._http_inference import _refuse_unhonoured
from yieldgate.server._http_logprobs import UNLIKELY, TokenLogprob, read_logprobs, token_text
from yieldgate.server.backends import BackendError, SimulatedBackend, features_of

# "é" is two bytes (0xC3 0xA9), then "!".
ENTRIES = [
    {
        "id": 0xC3,
        "logprob": -0.5,
        "top": [{"id": 0xC3, "logprob": -0.5}, {"id": 65, "logprob": -1}],
    },
    {
        "id": 0xA9,
        "logprob": -0.25,
        "top": [{"id": 0xA9, "logprob": -0.25}, {"id": 66, "logprob": -2}],
    },
    {"id": 33, "logprob": -3.0, "top": [{"id": 46, "logprob": -0.1}, {"id": 44, "logprob": -2.5}]},
]
RESULT = {"text": "é!", "token_ids": [0xC3, 0xA9, 33], "logprobs": ENTRIES}


def test_read_logprobs() -> None:
    assert read_logprobs({"text": "x"}) is None
    assert read_logprobs("x") is None
    read = read_logprobs(RESULT)
    assert read is not None
    assert read[0] == TokenLogprob(0xC3, -0.5, ((0xC3, -0.5), (65, -1.0)))
    underflow = read_logprobs({"logprobs": [{"id": 1, "logprob": -math.inf}]})
    assert underflow == (TokenLogprob(1, UNLIKELY),)


@pytest.mark.parametrize(
    "logprobs",
    [
        {"id": 1},
        [{"id": 256, "logprob": 0}],
        [{"id": True, "logprob": 0}],
        [{"id": 1, "logprob": "0"}],
        [{"id": 1, "logprob": 0, "top": {}}],
        [{"id": 1, "logprob": 0, "top": [1]}],
        [5],
    ],
)
def test_malformed_logprobs_are_the_backends_fault(logprobs: Any) -> None:
    with pytest.raises(BackendError) as info:
        read_logprobs({"logprobs": logprobs})
    assert not info.value.retryable


def test_a_byte_that_is_no_whole_character_is_spelt_as_openai_does() -> None:
    assert token_text(65) == "A"
    assert token_text(0xE2) == "bytes:\\xe2"


def chat_body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [
            {"role": "user", "content": "hi"},
        ],
        **fields,
    }


@pytest.mark.parametrize(
    ("fields", "params"),
    [
        ({}, {}),
        ({"logprobs": False, "top_logprobs": 0, "top_p": 1}, {}),
        ({"logprobs": True}, {"logprobs": 0}),
        ({"logprobs": True, "top_logprobs": 20, "top_p": 0.5}, {"logprobs": 20, "top_p": 0.5}),
        ({"logprobs": True, "backend_params": {"logprobs": 1}}, {"logprobs": 1}),
    ],
)
def test_chat_logprobs_and_top_p_become_params(
    fields: dict[str, Any], params: dict[str, Any]
) -> None:
    job = ChatCompletions().parse(chat_body(**fields), None, "m")
    assert {k: job.params[k] for k in ("logprobs", "top_p") if k in job.params} == params


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 1}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": 1.0}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
    ],
)
def test_chat_refuses_bad_logprobs_and_top_p(fields: dict[str, Any], param: str | None) -> None:
    with pytest.raises(BadRequest) as info:
        ChatCompletions().parse(chat_body(**fields), None, "m")
    assert info.value.param == param


@pytest.mark.parametrize(("value", "asked"), [(None, None), (False, None), (0, 0), (5, 5)])
def test_completions_logprobs_count(value: Any, asked: int | None) -> None:
    job = Completions().parse({"prompt": "p", "logprobs": value}, None, "m")
    assert job.params.get("logprobs") == asked


@pytest.mark.parametrize("value", [6, -1, True, 1.5, "2"])
def test_completions_refuse_bad_logprobs(value: Any) -> None:
    with pytest.raises(BadRequest) as info:
        Completions().parse({"prompt": "p", "logprobs": value}, None, "m")
    assert info.value.param == "logprobs"


def sse_data(event: bytes) -> Any:
    assert event.startswith(b"data: ")
    return json.loads(event[len(b"data: ") :])


def test_chat_bodies_and_chunks_carry_openai_shapes() -> None:
    dialect = ChatCompletions()
    job = dialect.parse(chat_body(logprobs=True, top_logprobs=2), None, "m")
    body = dialect.ok(job, _with_logprobs(job))
    reply = ChatCompletion.model_validate(body)
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.refusal is None
    content = logprobs.content
    assert content is not None
    assert [(e.token, e.bytes, e.logprob) for e in content] == [
        ("bytes:\\xc3", [0xC3], -0.5),
        ("bytes:\\xa9", [0xA9], -0.25),
        ("!", [33], -3.0),
    ]
    assert [(t.token, t.bytes, t.logprob) for t in content[2].top_logprobs] == [
        (".", [46], -0.1),
        (",", [44], -2.5),
    ]
    chunk = ChatCompletionChunk.model_validate(
        sse_data(dialect.piece_of(job, 0, {"text": "", "logprobs": ENTRIES[:1]}))
    )
    chunk_logprobs = chunk.choices[0].logprobs
    assert chunk_logprobs is not None
    assert chunk_logprobs.content is not None
    assert chunk_logprobs.content[0].token == "bytes:\\xc3"
    plain = ChatCompletionChunk.model_validate(sse_data(dialect.piece_of(job, 1, {"text": "x"})))
    assert plain.choices[0].logprobs is None


def test_completion_bodies_and_chunks_carry_openai_shapes() -> None:
    dialect = Completions()
    job = dialect.parse({"prompt": "p", "logprobs": 1}, None, "m")
    reply = Completion.model_validate(dialect.ok(job, _with_logprobs(job)))
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.tokens == ["bytes:\\xc3", "bytes:\\xa9", "!"]
    assert logprobs.token_logprobs == [-0.5, -0.25, -3.0]
    # The top one, and the sampled token where it is not among them.
    assert logprobs.top_logprobs == [
        {"bytes:\\xc3": -0.5, "A": -1.0},
        {"bytes:\\xa9": -0.25, "B": -2.0},
        {".": -0.1, ",": -2.5, "!": -3.0},
    ]
    # "é" starts at 0 (both its bytes sit there), "!" at 1.
    assert logprobs.text_offset == [0, 0, 1]
    # Streamed: offsets count the text sent before each chunk.
    offsets = []
    for i, (text, entry) in enumerate(zip(["", "é", "!"], ENTRIES, strict=True)):
        event = dialect.piece_of(job, i, {"text": text, "logprobs": [entry]})
        # (a stream's choices have no finish_reason yet: only their logprobs are checked)
        chunk_logprobs = Logprobs.model_validate(sse_data(event)["choices"][0]["logprobs"])
        assert chunk_logprobs.text_offset is not None
        offsets.extend(chunk_logprobs.text_offset)
    assert offsets == [0, 0, 1]


def _with_logprobs(job: Job) -> Generated:
    return dataclasses.replace(generated(job, RESULT), logprobs=read_logprobs(RESULT))


def test_only_a_backend_that_declares_a_feature_has_it() -> None:
    assert features_of(SimulatedBackend()) == frozenset()
    assert features_of(object()) == frozenset()

    class Declares:
        features = frozenset({"logprobs", "top_p", "something-else"})

    assert features_of(Declares()) == {"logprobs", "top_p"}


def test_tgi_tokens_carry_the_backends_logprobs_where_it_sends_them() -> None:
    dialect = TgiGenerate(stream=None)
    job = dialect.parse({"inputs": "p", "parameters": {"details": True}}, None, "m")
    assert job.logprobs_where_honoured
    body = dialect.ok(job, _with_logprobs(job))[0]
    assert [t["logprob"] for t in body["details"]["tokens"]] == [-0.5, -0.25, -3.0]
    # A backend that sends none: null, as before.
    plain = dialect.ok(job, generated(job, RESULT))[0]
    assert [t["logprob"] for t in plain["details"]["tokens"]] == [None, None, None]
    # Streamed: each event's token has its own; the last one, held for the end, the answer's last.
    event = sse_data(
        dialect.piece_of(job, 0, {"text": "", "token_ids": [0xC3], "logprobs": ENTRIES[:1]})
    )
    assert event["token"]["logprob"] == -0.5
    end = sse_data(dialect.end_with(job, 2, "!", (33,), _with_logprobs(job)))
    assert (end["token"]["id"], end["token"]["logprob"]) == (33, -3.0)


def test_logprobs_taken_where_honoured_are_asked_only_of_a_backend_that_has_them() -> None:
    def tgi_job() -> Job:
        return TgiGenerate(stream=None).parse({"inputs": "p"}, None, "m")

    class Declares:
        features = frozenset({"logprobs"})

    job = tgi_job()
    _refuse_unhonoured(job, SimulatedBackend())
    assert "logprobs" not in job.params
    job = tgi_job()
    _refuse_unhonoured(job, Declares())  # type: ignore[arg-type]
    assert job.params["logprobs"] == 0

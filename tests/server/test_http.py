"""The HTTP fronts in-process: a real uvicorn on 127.0.0.1:0 beside the TCP front.

Every route's shape, streams, yields, errors, disconnects and shutdown, with
httpx (and the official openai client) as the HTTP peer.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import httpx
import openai
import pytest
from huggingface_hub import TextGenerationStreamOutput
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RawClient, stats_when, submit
from yieldgate.server import (
    Governor,
    GovernorConfig,
    HttpConfig,
    PriorityPolicy,
    Server,
    SimulatedBackend,
    SimulatedConfig,
    TcpConfig,
    Work,
)
from yieldgate.server._http_guard import MAX_HEAD_BYTES, GuardedProtocol, Parser, protocol_class
from yieldgate.server.backends import BackendError, Emit

pytestmark = pytest.mark.anyio

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


class ScriptedBackend(SimulatedBackend):
    """The simulated backend, plus failures it cannot produce: ``backend_params.mode``."""

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        mode = work.params.get("mode")
        if mode == "fatal":
            raise BackendError("the model is broken", retryable=False)
        if mode == "no-text":
            return {"tokens": [1, 2]}
        if mode == "counts":
            return {"text": work.body, "prompt_tokens": 7, "completion_tokens": 2}
        if mode == "bad-chunk" and emit is not None:
            await emit({"text": "fine "})
            await emit({"bytes": 1})
        if mode == "degraded":  # the harness's graceful degradation cut the output
            degraded = {"max_tokens": 2, "requested_max_tokens": 9, "level": 0}
            if emit is not None:
                await emit({"text": "a", "degraded": degraded})
                await emit({"text": "b", "last": True})
            return {"text": "ab", "completion_tokens": 2, "degraded": degraded}
        return await super().execute(work, emit)


@dataclass
class Live:
    server: Server
    url: str
    http: httpx.AsyncClient
    tcp_host: str
    tcp_port: int

    async def stats(self) -> dict[str, Any]:
        response = await self.http.get("/stats")
        assert response.status_code == 200
        stats: dict[str, Any] = response.json()
        return stats

    async def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 15.0
    ) -> dict[str, Any]:
        return await stats_when(self.stats, predicate, timeout)

    async def tcp(self) -> RawClient:
        return RawClient(await anyio.connect_tcp(self.tcp_host, self.tcp_port))


Start = Callable[..., Awaitable[Live]]


@pytest.fixture
async def start() -> AsyncIterator[Start]:
    """Start in-process servers (TCP and HTTP on port 0); all are stopped at teardown."""
    started: list[Live] = []
    async with anyio.create_task_group() as tg:

        async def _start(
            *,
            max_inflight: int = 1,
            exec_ms: float = 5,
            cold_start_s: float = 0.0,
            grace_s: float = 5.0,
            max_body_bytes: int = 1 << 20,
            reserve_high: int = 0,
            **http: Any,
        ) -> Live:
            backend = ScriptedBackend(
                SimulatedConfig(exec_ms=exec_ms, cold_start_s=cold_start_s, stream_chunks=3)
            )
            config = GovernorConfig(
                max_inflight=max_inflight,
                initial_exec_ms=exec_ms + 1,
                priority=PriorityPolicy(reserved_for_high=reserve_high),
            )
            server = Server(
                Governor(config),
                backend,
                tcp=TcpConfig(port=0),
                http=HttpConfig(port=0, max_body_bytes=max_body_bytes, model_name="sim-1", **http),
                grace_s=grace_s,
            )
            tcp_url = await tg.start(lambda task_status: server.run(task_status=task_status))
            host, _, port = tcp_url.removeprefix("tcp://").rpartition(":")
            url = server.urls[1]
            live = Live(server, url, httpx.AsyncClient(base_url=url), host, int(port))
            started.append(live)
            return live

        try:
            yield _start
        finally:
            for live in started:
                await live.http.aclose()
                live.server.request_stop(hard=True)


async def post_json(client: httpx.AsyncClient, path: str, body: Any) -> httpx.Response:
    return await client.post(path, json=body)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_cut_output_is_announced_in_a_header(start: Start, stream: bool) -> None:
    live = await start()
    body = {"model": "m", "prompt": "p", "stream": stream, "backend_params": {"mode": "degraded"}}
    response = await post_json(live.http, COMPLETIONS, body)
    assert response.status_code == 200
    assert response.headers["x-yieldgate-degraded"] == "max_tokens=2; requested=9; level=0"
    plain = await post_json(live.http, COMPLETIONS, {"model": "m", "prompt": "p"})
    assert "x-yieldgate-degraded" not in plain.headers


def events(text: str) -> list[Any]:
    """The data of each server-sent event (``[DONE]`` as the string)."""
    found = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        found.append(data if data == "[DONE]" else json.loads(data))
    return found


def counters_add_up(stats: dict[str, Any]) -> bool:
    ended = stats["executed_total"] + stats["failed_total"] + stats["cancelled_total"]
    return bool(stats["admitted_total"] == ended + stats["inflight"])


# -- success shapes -----------------------------------------------------------


async def test_chat_completion_parses_as_the_official_type(start: Start) -> None:
    live = await start()
    body = {
        "model": "my-model",
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}],
            },
        ],
        "max_tokens": 16,
        "temperature": 0.2,
    }
    response = await live.http.post(CHAT, json=body)
    assert response.status_code == 200
    reply = ChatCompletion.model_validate(response.json())
    assert reply.object == "chat.completion"
    assert reply.model == "my-model"
    assert reply.id.startswith("chatcmpl-")
    # The simulated backend echoes its prompt (one "role: content" line per message),
    # cut to max_tokens tokens: UTF-8 bytes.
    assert reply.choices[0].message.content == "system: be brief"
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (31, 16)
    assert reply.usage.total_tokens == 47


async def test_completion_and_backend_token_counts(start: Start) -> None:
    live = await start()
    response = await live.http.post(
        COMPLETIONS,
        json={"model": "m", "prompt": ["say this"], "backend_params": {"mode": "counts"}},
    )
    assert response.status_code == 200
    reply = Completion.model_validate(response.json())
    assert (reply.object, reply.model, reply.choices[0].text) == (
        "text_completion",
        "m",
        "say this",
    )
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (7, 2)


async def test_models_lists_the_configured_name(start: Start) -> None:
    live = await start()
    response = await live.http.get("/v1/models")
    assert response.status_code == 200
    listing = response.json()
    assert listing["object"] == "list"
    [model] = listing["data"]
    assert (model["id"], model["object"], model["owned_by"]) == ("sim-1", "model", "yieldgate")
    assert isinstance(model["created"], int)


async def test_official_openai_client(start: Start) -> None:
    live = await start()
    client = openai.AsyncOpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0)
    async with client:
        chat = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "hello world"}],
            extra_body={"backend_params": {"exec_ms": 1}},
        )
        assert chat.choices[0].message.content == "user: hello world"
        stream = await client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "a streamed reply"}],
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"backend_params": {"chunks": 4}},
        )
        pieces, usage = [], None
        async for chunk in stream:
            pieces.extend(c.delta.content or "" for c in chunk.choices)
            usage = chunk.usage or usage
        assert "".join(pieces) == "user: a streamed reply"
        assert usage is not None
        assert usage.prompt_tokens == usage.completion_tokens == len("user: a streamed reply")
        text = await client.completions.create(model="m", prompt="plain")
        assert text.choices[0].text == "plain"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["sim-1"]


async def test_huggingface_route(start: Start) -> None:
    live = await start()
    response = await live.http.post(
        "/models/org/some-model", json={"inputs": "abc", "parameters": {"max_new_tokens": 5}}
    )
    assert response.status_code == 200
    assert response.json() == [{"generated_text": "abc"}]


async def test_tgi_routes(start: Start) -> None:
    live = await start()
    generate = await live.http.post("/generate", json={"inputs": "a b", "parameters": {}})
    assert (generate.status_code, generate.json()) == (200, {"generated_text": "a b"})
    compat = await live.http.post("/", json={"inputs": "a b"})
    assert (compat.status_code, compat.json()) == (200, [{"generated_text": "a b"}])


# -- streams ------------------------------------------------------------------


async def test_chat_stream_format(start: Start) -> None:
    live = await start()
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "streamed"}],
        "stream": True,
        "backend_params": {"chunks": 3},
    }
    response = await live.http.post(CHAT, json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    found = events(response.text)
    assert found[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate(e) for e in found[:-1]]
    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "user: streamed"
    assert [c.choices[0].finish_reason for c in chunks] == [None, None, None, "stop"]


async def test_completion_stream_format(start: Start) -> None:
    live = await start()
    body = {"model": "m", "prompt": "one two", "stream": True, "backend_params": {"chunks": 2}}
    found = events((await live.http.post(COMPLETIONS, json=body)).text)
    assert found[-1] == "[DONE]"
    chunks = found[:-1]
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == "one two"
    # As OpenAI sends it: finish_reason null until the last chunk (which the type requires).
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "stop"]
    assert Completion.model_validate(chunks[-1]).choices[0].text == ""


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate_stream", {"inputs": "tokens one by one"}),
        ("/", {"inputs": "tokens one by one", "stream": True}),
        ("/models/m", {"inputs": "tokens one by one", "stream": True}),
    ],
)
async def test_tgi_style_stream_format(start: Start, path: str, body: dict[str, Any]) -> None:
    live = await start()
    body = {**body, "parameters": {"backend_params": {"chunks": 3}}}
    response = await live.http.post(path, json=body)
    assert response.status_code == 200
    found = [TextGenerationStreamOutput.parse_obj_as_instance(e) for e in events(response.text)]
    # The echo streams runs of characters; an event's id is its last byte's, a token's id.
    assert [e.token.text for e in found] == ["tokens", " one b", "y one"]
    assert [e.token.id for e in found] == [ord("s"), ord("b"), ord("e")]
    # As in TGI, the last event carries the last token, the whole text and the details.
    assert [e.generated_text for e in found] == [None, None, "tokens one by one"]
    assert [e.token.special for e in found] == [False, False, False]
    assert [e.details for e in found[:-1]] == [None, None]
    details = found[-1].details
    assert details is not None
    assert (details.finish_reason, details.generated_tokens) == ("eos_token", 17)
    assert (details.seed, details.input_length) == (None, 17)


async def test_tgi_details_have_tgis_schema(start: Start) -> None:
    live = await start()
    parameters = {"details": True, "decoder_input_details": True, "stop": ["three"], "seed": 3}
    body = {"inputs": "one two three", "parameters": parameters}
    answer = (await live.http.post("/generate", json=body)).json()
    # TGI's GenerateResponse: generated_text and, asked for, its Details.
    assert answer.keys() == {"generated_text", "details"}
    assert answer["generated_text"] == "one two "
    details = answer["details"]
    assert details.keys() == {"finish_reason", "generated_tokens", "seed", "prefill", "tokens"}
    assert (details["finish_reason"], details["generated_tokens"], details["seed"]) == (
        "stop_sequence",
        8,
        3,
    )
    # Tokens are bytes: an id is the byte's value.
    assert details["prefill"] == [
        {"id": ord(c), "text": c, "logprob": None} for c in "one two three"
    ]
    assert details["tokens"] == [
        {"id": ord(c), "text": c, "logprob": None, "special": False} for c in "one two "
    ]
    # Without details, TGI answers the text alone; a bad stop is TGI's 422.
    plain = await live.http.post("/generate", json={"inputs": "x"})
    assert plain.json() == {"generated_text": "x"}
    bad = await live.http.post("/generate", json={"inputs": "x", "parameters": {"stop": [3]}})
    assert bad.status_code == 422
    assert bad.json()["error_type"] == "validation"
    # A parameter no backend here honours is refused, not ignored.
    top_k = await live.http.post("/generate", json={"inputs": "x", "parameters": {"top_k": 5}})
    assert (top_k.status_code, top_k.json()["error_type"]) == (422, "validation")
    assert "parameters.top_k" in top_k.json()["error"]


async def test_an_empty_tgi_stream_ends_with_an_empty_special_token(start: Start) -> None:
    live = await start()
    response = await live.http.post("/generate_stream", json={"inputs": ""})
    [last] = [TextGenerationStreamOutput.parse_obj_as_instance(e) for e in events(response.text)]
    assert (last.token.text, last.token.special, last.generated_text) == ("", True, "")
    assert last.details is not None
    assert last.details.generated_tokens == 0


async def test_openai_refusals_name_the_parameter(start: Start) -> None:
    live = await start()
    body = {"model": "m", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}
    reply = await live.http.post("/v1/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "stop")
    reply = await live.http.post("/v1/completions", json={"model": "m", "prompt": "x", "echo": 1})
    assert reply.json()["error"]["param"] == "echo"


async def test_a_stream_holds_its_slot_until_it_ends(start: Start) -> None:
    live = await start(max_inflight=1)
    params = {"exec_ms": 60_000, "chunks": 10_000}  # the first piece at once, then slowly
    body = {"inputs": "slow stream", "parameters": {"backend_params": params}}
    async with live.http.stream("POST", "/generate_stream", json=body) as response:
        assert response.status_code == 200
        lines = response.aiter_lines()
        assert (await anext(lines)).startswith("data: ")
        stats = await live.stats()
        assert stats["inflight"] == 1
        other = await live.http.post("/generate", json={"inputs": "x"})
        assert other.status_code == 429
    # Leaving mid-stream cancels the rest at once.
    stats = await live.wait_for(lambda s: s["inflight"] == 0)
    assert stats["cancelled_total"] == 1


# -- yields ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "dialect_fields"),
    [
        (
            CHAT,
            {"model": "m", "messages": [{"role": "user", "content": "x"}]},
            {"error": {"message": str, "type": "yield", "param": None, "code": "saturated"}},
        ),
        (COMPLETIONS, {"model": "m", "prompt": "x"}, {"error": {"type": "yield"}}),
        (
            "/generate",
            {"inputs": "x"},
            {"error": "Model is overloaded", "error_type": "overloaded"},
        ),
        ("/generate_stream", {"inputs": "x"}, {"error_type": "overloaded"}),
        ("/", {"inputs": "x"}, {"error_type": "overloaded"}),
        ("/models/m", {"inputs": "x"}, {"error": str}),
    ],
)
async def test_a_full_server_answers_429_with_both_hints(
    start: Start, path: str, body: dict[str, Any], dialect_fields: dict[str, Any]
) -> None:
    live = await start(max_inflight=1, exec_ms=2000)
    tcp = await live.tcp()
    try:
        await tcp.send(submit("hold"))
        await live.wait_for(lambda s: s["inflight"] == 1)
        response = await live.http.post(path, json=body)
    finally:
        await tcp.aclose()
    assert response.status_code == 429
    reply = response.json()
    hint = reply["retry_hint_ms"]
    assert 0 < hint <= 2000
    assert response.headers["retry-after-ms"] == str(hint)
    assert response.headers["retry-after"] == str(-(-hint // 1000))
    assert response.headers["x-should-retry"] == "true"
    assert (reply["status"], reply["reason"]) == ("yield", "saturated")
    assert (reply["inflight"], reply["max_inflight"]) == (1, 1)
    for key, expected in dialect_fields.items():
        if isinstance(expected, dict):
            for inner, value in expected.items():
                if value is str:
                    assert isinstance(reply[key][inner], str)
                else:
                    assert reply[key][inner] == value
        elif expected is str:
            assert isinstance(reply[key], str)
        else:
            assert reply[key] == expected
    stats = await live.wait_for(lambda s: s["inflight"] == 0)
    assert (stats["yielded_total"], stats["yielded_by_reason"]) == (1, {"saturated": 1})
    assert stats["errors_total"] == 0


async def test_tcp_and_http_share_the_slots(start: Start) -> None:
    live = await start(max_inflight=1)
    tcp = await live.tcp()
    hold = {"model": "m", "prompt": "x", "backend_params": {"exec_ms": 10_000}}
    try:
        # HTTP holds the only slot: a TCP submit yields.
        async with anyio.create_task_group() as tg:
            tg.start_soon(post_json, live.http, COMPLETIONS, hold)
            await live.wait_for(lambda s: s["inflight"] == 1)
            reply = await tcp.submit("from tcp")
            assert (reply["status"], reply["reason"], reply["inflight"]) == (
                "yield",
                "saturated",
                1,
            )
            tg.cancel_scope.cancel()  # the HTTP client leaves: its slot frees
        await live.wait_for(lambda s: s["inflight"] == 0)
        # TCP holds it: an HTTP request yields.
        await tcp.send(submit("hold", params={"exec_ms": 10_000}))
        await live.wait_for(lambda s: s["inflight"] == 1)
        response = await live.http.post("/generate", json={"inputs": "from http"})
        assert response.status_code == 429
        assert response.json()["inflight"] == 1
    finally:
        await tcp.aclose()
    stats = await live.wait_for(lambda s: s["inflight"] == 0)
    assert (stats["yielded_total"], stats["cancelled_total"]) == (2, 2)
    assert stats["inflight_peak"] == 1
    assert counters_add_up(stats)


async def test_cold_start(start: Start) -> None:
    live = await start(cold_start_s=0.6)
    health = await live.http.get("/health")
    assert (health.status_code, health.json()) == (503, {"status": "loading"})
    sent = time.monotonic()
    first = await live.http.post("/models/org/m", json={"inputs": "x"})
    assert first.status_code == 503
    assert "retry-after" not in first.headers
    body = first.json()
    assert body["error"] == "Model org/m is currently loading"
    assert set(body) == {"error", "estimated_time"}
    assert 0 < body["estimated_time"] <= 0.6
    await anyio.sleep(0.05)
    second = (await live.http.post("/models/org/m", json={"inputs": "x"})).json()
    assert second["estimated_time"] < body["estimated_time"]
    # Other dialects see a 429 yield, reason cold_start.
    openai_style = await live.http.post(COMPLETIONS, json={"model": "m", "prompt": "x"})
    assert (openai_style.status_code, openai_style.json()["reason"]) == (429, "cold_start")
    assert openai_style.json()["error"]["code"] == "cold_start"
    # Truthful: warm no sooner than the estimate said (however late a loaded machine is).
    with anyio.fail_after(15):
        while (await live.http.get("/health")).status_code != 200:  # noqa: ASYNC110
            await anyio.sleep(0.01)
    assert time.monotonic() - sent >= body["estimated_time"] - 0.002
    warm = await live.http.post("/models/org/m", json={"inputs": "x"})
    assert (warm.status_code, warm.json()) == (200, [{"generated_text": "x"}])
    stats = await live.stats()
    assert stats["yielded_by_reason"] == {"cold_start": 3}


# -- errors ---------------------------------------------------------------------


def error_code(path: str, reply: dict[str, Any]) -> str:
    code: str = reply["error"]["code"] if path.startswith("/v1/") else reply["code"]
    return code


ROUTES = [
    (CHAT, {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
    (COMPLETIONS, {"model": "m", "prompt": "x"}),
    ("/models/m", {"inputs": "x"}),
    ("/generate", {"inputs": "x"}),
]


def with_backend_params(path: str, body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    if path.startswith("/v1/"):
        return {**body, "backend_params": params}
    return {**body, "parameters": {"backend_params": params}}


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_bad_requests(start: Start, path: str, body: dict[str, Any]) -> None:
    live = await start()
    invalid = 422 if path == "/generate" else 400
    cases: list[tuple[dict[str, Any], bytes | None, dict[str, str]]] = [
        ({}, b"{not json", {}),
        ({}, b"[1, 2]", {}),
        ({}, b'{"inputs": NaN}', {}),
        ({}, b"[" * 5000 + b"]" * 5000, {}),
        ({"model": 3, "messages": 4, "prompt": 5, "inputs": 6}, None, {}),
        (body, None, {"x-yieldgate-priority": "urgent"}),
        (body, None, {"x-yieldgate-deadline-ms": "soon"}),
        (with_backend_params(path, body, {"exec_ms": -1}), None, {}),
        (with_backend_params(path, body, "not an object"), None, {}),  # type: ignore[arg-type]
    ]
    for json_body, raw, headers in cases:
        if raw is None:
            response = await live.http.post(path, json=json_body, headers=headers)
        else:
            response = await live.http.post(path, content=raw, headers=headers)
        assert response.status_code == invalid, (json_body, raw, response.text)
        assert response.headers["x-should-retry"] == "false"
        reply = response.json()
        if path.startswith("/v1/"):
            assert reply["error"]["type"] == "invalid_request_error"
            assert isinstance(reply["error"]["message"], str)
        else:
            assert isinstance(reply["error"], str)
        if path == "/generate":
            assert reply["error_type"] == "validation"
    stats = await live.stats()
    # Refused before admission: no slot was ever taken.
    assert stats["admitted_total"] == 0
    assert stats["errors_by_code"] == {"bad_frame": len(cases) - 1, "backend_error": 1}


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_backend_failures(start: Start, path: str, body: dict[str, Any]) -> None:
    live = await start()
    retryable = await live.http.post(path, json=with_backend_params(path, body, {"fail": True}))
    assert retryable.status_code == 503
    assert retryable.headers["x-should-retry"] == "true"
    assert error_code(path, retryable.json()) == "backend_error"
    fatal = await live.http.post(path, json=with_backend_params(path, body, {"mode": "fatal"}))
    assert fatal.status_code == 500
    assert fatal.headers["x-should-retry"] == "false"
    no_text = await live.http.post(path, json=with_backend_params(path, body, {"mode": "no-text"}))
    assert no_text.status_code == 500
    if path.startswith("/v1/"):
        assert fatal.json()["error"]["type"] == "server_error"
    if path == "/generate":
        assert fatal.json()["error_type"] == "generation"
    stats = await live.stats()
    assert (stats["failed_total"], stats["errors_by_code"]) == (3, {"backend_error": 3})
    assert counters_add_up(stats)


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_deadlines(start: Start, path: str, body: dict[str, Any]) -> None:
    live = await start()
    spent = await live.http.post(path, json=body, headers={"x-yieldgate-deadline-ms": "0"})
    assert spent.status_code == 504
    assert error_code(path, spent.json()) == "deadline_exceeded"
    slow = with_backend_params(path, body, {"exec_ms": 60_000})
    passed = await live.http.post(path, json=slow, headers={"x-yieldgate-deadline-ms": "50"})
    assert passed.status_code == 504
    assert passed.headers["x-should-retry"] == "false"
    ok = await live.http.post(path, json=body, headers={"x-yieldgate-deadline-ms": "60000"})
    assert ok.status_code == 200
    stats = await live.stats()
    assert (stats["admitted_total"], stats["cancelled_total"], stats["inflight"]) == (2, 1, 0)
    assert stats["errors_by_code"] == {"deadline_exceeded": 2}


async def test_body_too_large(start: Start) -> None:
    live = await start(max_body_bytes=1024)
    big = {"inputs": "x" * 5000}
    for path in ("/generate", "/v1/completions", "/models/m"):
        response = await live.http.post(path, json=big)
        assert response.status_code == 413
        assert error_code(path, response.json()) == "frame_too_large"
    edge = await live.http.post("/generate", content=b'{"inputs": "' + b"y" * 990 + b'"}')
    assert edge.status_code == 200
    stats = await live.stats()
    assert stats["errors_by_code"] == {"frame_too_large": 3}


async def test_unknown_routes_and_methods(start: Start) -> None:
    live = await start()
    missing = await live.http.get("/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "unknown_op"
    wrong = await live.http.get("/generate")
    assert (wrong.status_code, wrong.headers["allow"]) == (405, "POST")
    assert wrong.json()["code"] == "unknown_op"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, {"model": "m", "messages": [{"role": "user", "content": "abcdef"}], "stream": True}),
        ("/generate_stream", {"inputs": "abcdef"}),
        ("/models/m", {"inputs": "abcdef", "stream": True}),
    ],
)
async def test_a_failure_mid_stream_ends_it_with_an_error_event(
    start: Start, path: str, body: dict[str, Any]
) -> None:
    live = await start()
    for params in ({"fail": True, "chunks": 2}, {"mode": "bad-chunk"}):
        response = await live.http.post(path, json=with_backend_params(path, body, params))
        assert response.status_code == 200
        found = events(response.text)
        assert "[DONE]" not in found
        *pieces, last = found
        assert pieces
        if path.startswith("/v1/"):
            assert last["error"]["code"] == "backend_error"
            assert isinstance(last["error"]["message"], str)
        else:
            assert (last["error_type"], last["code"]) == ("generation", "backend_error")
    stats = await live.stats()
    assert (stats["failed_total"], stats["errors_by_code"]) == (2, {"backend_error": 2})


async def test_a_stream_that_fails_before_its_first_piece_gets_a_status(start: Start) -> None:
    live = await start()
    body = {"inputs": "x", "parameters": {"backend_params": {"mode": "fatal"}}}
    response = await live.http.post("/generate_stream", json=body)
    assert response.status_code == 500
    assert response.json()["error_type"] == "generation"


# -- disconnects, stats, metrics ---------------------------------------------


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_a_client_that_leaves_frees_its_slot_at_once(
    start: Start, path: str, body: dict[str, Any]
) -> None:
    live = await start(max_inflight=2)
    slow = with_backend_params(path, body, {"exec_ms": 60_000})
    async with anyio.create_task_group() as tg:
        tg.start_soon(post_json, live.http, path, slow)
        tg.start_soon(post_json, live.http, path, slow)
        await live.wait_for(lambda s: s["inflight"] == 2)
        tg.cancel_scope.cancel()
    stats = await live.wait_for(lambda s: s["inflight"] == 0)
    assert (stats["cancelled_total"], stats["executed_total"], stats["errors_total"]) == (2, 0, 0)
    assert counters_add_up(stats)
    assert (await live.http.post(path, json=body)).status_code == 200


async def test_stats_has_both_fronts(start: Start) -> None:
    live = await start()
    tcp = await live.tcp()
    try:
        assert (await tcp.submit("over tcp"))["status"] == "ok"
        assert (await live.http.post("/generate", json={"inputs": "over http"})).status_code == 200
        over_tcp = await tcp.stats()
    finally:
        await tcp.aclose()
    over_http = await live.stats()
    assert over_tcp.keys() - {"id", "status", "op"} == over_http.keys()
    assert over_tcp["executed_total"] == over_http["executed_total"] == 2
    assert (over_tcp["connections_open"], over_tcp["connections_total"]) == (1, 1)
    assert over_tcp["http_connections_open"] == over_http["http_connections_open"] == 1
    assert over_http["http_requests_total"] == 1  # the /generate; this /stats is not done yet


async def test_metrics(start: Start) -> None:
    live = await start(max_inflight=1)
    await live.http.post("/generate", json={"inputs": "x"})
    await live.http.post("/generate", content=b"nope")
    tcp = await live.tcp()
    try:
        await tcp.send(submit("hold", params={"exec_ms": 10_000}))
        await live.wait_for(lambda s: s["inflight"] == 1)
        await live.http.post("/generate", json={"inputs": "x"})
        response = await live.http.get("/metrics")
    finally:
        await tcp.aclose()
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    assert samples[("yieldgate_inflight", ())] == 1
    assert samples[("yieldgate_max_inflight", ())] == 1
    assert samples[("yieldgate_executed_total", ())] == 1
    assert samples[("yieldgate_yielded_total", (("reason", "saturated"),))] == 1
    assert samples[("yieldgate_yielded_total", (("reason", "cold_start"),))] == 0
    assert samples[("yieldgate_errors_total", (("code", "bad_frame"),))] == 1
    http = "yieldgate_http_requests_total"
    assert samples[(http, (("route", "/generate"), ("status", "200")))] == 1
    assert samples[(http, (("route", "/generate"), ("status", "422")))] == 1
    assert samples[(http, (("route", "/generate"), ("status", "429")))] == 1


async def test_every_route_is_counted_under_its_route(start: Start) -> None:
    live = await start()
    chat = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    requests: list[tuple[str, str, Any]] = [
        ("POST", "/models/org/m", {"inputs": "x"}),
        ("POST", "/models/org/m/v1/chat/completions", chat),
        ("POST", "/generate", {"inputs": "x"}),
        ("GET", "/generate", None),
        ("GET", "/models/org/m", None),
        ("POST", "/generate/", {"inputs": "x"}),
    ]
    for method, path, body in requests:
        await live.http.request(method, path, json=body)
    stats = await live.stats()
    response = await live.http.get("/metrics")
    counted = {
        (s.labels["route"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if s.name == "yieldgate_http_requests_total"
    }
    assert counted == {
        ("/models/{model_id}", "200"): 1,
        ("/models/{model_id}/v1/chat/completions", "200"): 1,
        ("/generate", "200"): 1,
        ("/generate", "405"): 1,
        ("/models/{model_id}", "405"): 1,
        ("unmatched", "404"): 1,
        ("/stats", "200"): 1,
    }
    assert stats["http_requests_total"] == len(requests)


async def test_each_yield_is_answered_with_its_own_hints(start: Start) -> None:
    # The 429 is encoded once per Yield: a new one (here, one more slot taken) is a new reply.
    live = await start(max_inflight=2, exec_ms=10_000, reserve_high=1)
    tcp = await live.tcp()
    try:
        replies = []
        for held in (1, 2):
            await tcp.send(submit(f"hold-{held}", priority="high"))
            await live.wait_for(lambda s, held=held: s["inflight"] == held)
            for _ in range(2):
                response = await live.http.post("/generate", json={"inputs": "x"})
                assert response.status_code == 429
                replies.append(response)
    finally:
        await tcp.aclose()
    for response in replies:
        reply = response.json()
        assert response.headers["retry-after-ms"] == str(reply["retry_hint_ms"])
        assert response.headers["content-length"] == str(len(response.content))
    assert [r.json()["inflight"] for r in replies] == [1, 1, 2, 2]


# -- shutdown -----------------------------------------------------------------


async def test_shutdown_finishes_admitted_work_and_refuses_new(start: Start) -> None:
    live = await start(max_inflight=2, grace_s=10)
    late = httpx.AsyncClient(base_url=live.url)
    try:
        assert (await late.get("/health")).status_code == 200  # a kept-alive connection
        async with anyio.create_task_group() as tg:
            replies: list[httpx.Response] = []

            async def admitted() -> None:
                body = {"inputs": "x", "parameters": {"backend_params": {"exec_ms": 300}}}
                replies.append(await live.http.post("/generate", json=body))

            tg.start_soon(admitted)
            await live.wait_for(lambda s: s["inflight"] == 1)
            live.server.request_stop()
            refused = await late.post("/generate", json={"inputs": "late"})
            assert refused.status_code == 503
            assert refused.json()["code"] == "shutting_down"
            assert refused.headers["x-should-retry"] == "true"
        assert replies[0].status_code == 200
        assert replies[0].json() == {"generated_text": "x"}
    finally:
        await late.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_shutdown_past_grace_answers_shutting_down(start: Start, stream: bool) -> None:
    live = await start(grace_s=0.2)
    path = "/generate_stream" if stream else "/generate"
    # A stream's first piece goes out at once (60 s in 10,000 pieces).
    body = {"inputs": "x", "parameters": {"backend_params": {"exec_ms": 60_000, "chunks": 10_000}}}
    async with anyio.create_task_group() as tg:
        replies: list[httpx.Response] = []

        async def forever() -> None:
            replies.append(await live.http.post(path, json=body))

        tg.start_soon(forever)
        await live.wait_for(lambda s: s["inflight"] == 1)
        live.server.request_stop()
    [reply] = replies
    assert reply.status_code == (200 if stream else 503)
    last = events(reply.text)[-1] if stream else reply.json()
    assert (last["code"], last["error_type"]) == ("shutting_down", "shutting_down")


async def test_stop_requested_before_run_returns_promptly() -> None:
    server = Server(
        Governor(),
        SimulatedBackend(),
        tcp=TcpConfig(port=0),
        http=HttpConfig(port=0),
        grace_s=0,
    )
    server.request_stop()
    with anyio.fail_after(5):
        await server.run()
    assert server.http is not None
    assert server.http.address is not None


# -- headers, timeouts and limits of the connection (issue 16) ---------------------


async def test_the_priority_header_is_read_whatever_its_case(start: Start) -> None:
    # Issue 16 item 16: "High" got 400, though header values are not frames.
    live = await start(max_inflight=2, reserve_high=1)
    hold = {"inputs": "x", "parameters": {"backend_params": {"exec_ms": 10_000}}}
    async with anyio.create_task_group() as tg:
        tg.start_soon(post_json, live.http, "/generate", hold)
        await live.wait_for(lambda s: s["inflight"] == 1)
        normal = await live.http.post("/generate", json={"inputs": "n"})
        assert normal.status_code == 429
        for value in ("high", "High", "HIGH", "hIgH"):
            # Only high may take the reserved slot, so a 200 means it was read as high.
            response = await live.http.post(
                "/generate",
                json={"inputs": "h", "parameters": {"backend_params": {"exec_ms": 1}}},
                headers={"X-Yieldgate-Priority": value},
            )
            assert (response.status_code, response.json()) == (200, {"generated_text": "h"})
        low = await live.http.post(
            "/generate", json={"inputs": "l"}, headers={"x-yieldgate-priority": "Low"}
        )
        assert low.status_code == 429
        tg.cancel_scope.cancel()


async def raw_http(live: Live) -> anyio.abc.SocketStream:
    host, _, port = live.url.removeprefix("http://").rpartition(":")
    return await anyio.connect_tcp(host, int(port))


async def read_until_closed(stream: anyio.abc.SocketStream, timeout: float = 15.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = bytearray()
    with anyio.fail_after(timeout):
        try:
            while True:
                received += await stream.receive()
        except (anyio.EndOfStream, anyio.BrokenResourceError, ConnectionError):
            return bytes(received)


# `yieldgate serve` runs on uvloop when it is installed: the guards are tested on both loops.
BOTH_LOOPS = pytest.mark.parametrize(
    "anyio_backend",
    [("asyncio", {}), ("asyncio", {"use_uvloop": True})],
    ids=["asyncio", "uvloop"],
)
# And it parses with httptools when it is installed, else h11: the guards hold on both.
BOTH_PARSERS = pytest.mark.parametrize("parser", ["httptools", "h11"])


@BOTH_LOOPS
@BOTH_PARSERS
async def test_a_head_that_does_not_arrive_whole_is_closed_after_the_head_timeout(
    start: Start, parser: str
) -> None:
    # Issue 16 item 14: a connection that sent nothing, or part of a head, stayed open for ever.
    live = await start(head_timeout_s=0.3, parser=parser)
    partials = [
        b"",  # nothing at all
        b"POST /generate HT",  # half a request line
        b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-ty",  # headers never finished
    ]
    streams = [await raw_http(live) for _ in partials]
    # After a whole response, the next head is timed too (uvicorn's keep-alive
    # timer stops at its first byte).
    after_response = await raw_http(live)
    streams.append(after_response)
    partials.append(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /hea")
    try:
        for stream, partial in zip(streams, partials, strict=True):
            if partial:
                await stream.send(partial)
        for stream in streams[:3]:
            assert await read_until_closed(stream) == b""
        reply = await read_until_closed(after_response)
        assert reply.startswith(b"HTTP/1.1 200 ")
        assert reply.count(b"HTTP/1.1") == 1
        # A client that sends whole requests is served.
        stats = await live.stats()
    finally:
        for stream in streams:
            await stream.aclose()
    assert stats["http_connections_head_timeout_total"] == 4
    assert stats["http_connections_open"] == 1  # the httpx client's, asking
    assert stats["admitted_total"] == 0


@BOTH_PARSERS
async def test_a_body_that_stalls_gets_408(start: Start, parser: str) -> None:
    live = await start(body_timeout_s=0.3, parser=parser)
    stream = await raw_http(live)
    try:
        head = (
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n"
        )
        await stream.send(head + b'{"model": "m", "prom')
        reply = await read_until_closed(stream)
    finally:
        await stream.aclose()
    status, _, rest = reply.partition(b"\r\n")
    assert status.startswith(b"HTTP/1.1 408 ")
    headers, _, body = rest.partition(b"\r\n\r\n")
    assert b"x-should-retry: true" in headers.lower()
    error = json.loads(body)["error"]
    assert (error["code"], error["type"]) == ("bad_frame", "invalid_request_error")
    assert "did not arrive within 0.3 s" in error["message"]
    stats = await live.stats()
    assert (stats["http_body_timeouts_total"], stats["admitted_total"]) == (1, 0)
    assert stats["errors_by_code"] == {"bad_frame": 1}


@BOTH_PARSERS
async def test_a_pipelined_body_that_stalls_gets_408(start: Start, parser: str) -> None:
    # The second request's head arrives with the first (h11 parses it only once the
    # first is answered, httptools at once): its body is timed all the same.
    live = await start(body_timeout_s=0.3, parser=parser)
    stream = await raw_http(live)
    try:
        await stream.send(
            b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
            b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n" + b'{"inputs": "x'
        )
        reply = await read_until_closed(stream)
    finally:
        await stream.aclose()
    first, _, second = reply.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 ")
    assert b"HTTP/1.1 408 " in second
    stats = await live.stats()
    assert (stats["http_body_timeouts_total"], stats["admitted_total"]) == (1, 0)


@BOTH_PARSERS
async def test_a_head_past_the_size_cap_is_refused(start: Start, parser: str) -> None:
    # httptools has no cap of its own: a head sent fast would grow for head_timeout_s.
    live = await start(parser=parser)
    streams = [await raw_http(live) for _ in range(2)]
    try:
        big = b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (MAX_HEAD_BYTES + 1)
        await streams[0].send(big)  # never finished
        # A body far past the cap is no head: it is read as the body it is.
        body = json.dumps({"inputs": "x" * (4 * MAX_HEAD_BYTES)}).encode()
        await streams[1].send(
            b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )
        refused = await read_until_closed(streams[0])
        served = await read_until_closed(streams[1])
        stats = await live.stats()
    finally:
        for stream in streams:
            await stream.aclose()
    # h11 enforces the same cap itself (uvicorn answers its 400) before the guard counts.
    assert refused.startswith(b"HTTP/1.1 431 " if parser == "httptools" else b"HTTP/1.1 4")
    assert served.startswith(b"HTTP/1.1 200 ")
    assert stats["http_connections_head_too_large_total"] == (1 if parser == "httptools" else 0)


@BOTH_PARSERS
async def test_http_connections_past_the_limit_are_closed_at_once(
    start: Start, parser: str
) -> None:
    live = await start(max_connections=3, parser=parser)
    await live.stats()  # the httpx client's connection: one of the three
    kept = [await raw_http(live) for _ in range(2)]
    extra = await raw_http(live)
    try:
        await live.wait_for(lambda s: s["http_connections_refused_total"] == 1)
        assert await read_until_closed(extra) == b""
        stats = await live.stats()
    finally:
        for stream in [*kept, extra]:
            await stream.aclose()
    assert (stats["http_connections_open"], stats["http_connections_total"]) == (3, 3)


def stalled_http_reader(live: Live, request: bytes) -> socket.socket:
    """A connection that sends ``request`` and then reads nothing (see test_tcp_limits)."""
    host, _, port = live.url.removeprefix("http://").rpartition(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(request)
    return sock


def post_request(path: str, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    return head.encode() + f"content-length: {len(raw)}\r\n\r\n".encode() + raw


@BOTH_LOOPS
@BOTH_PARSERS
async def test_a_stream_whose_reader_stopped_is_cancelled_after_the_write_timeout(
    start: Start, parser: str
) -> None:
    # Issue 16 item 12: a stream whose reader stopped held its slot for ever.
    live = await start(max_inflight=2, max_body_bytes=32 << 20, write_timeout_s=0.3, parser=parser)
    params = {"exec_ms": 2000, "chunks": 1000}  # 8 MB of events in 2 s: more than buffers hold
    request = post_request(
        "/generate_stream", {"inputs": "x" * (8 << 20), "parameters": {"backend_params": params}}
    )
    stalled = [await anyio.to_thread.run_sync(stalled_http_reader, live, request) for _ in range(2)]
    try:
        stats = await live.wait_for(
            lambda s: s["http_connections_write_timeout_total"] == 2 and s["inflight"] == 0,
            timeout=60,
        )
    finally:
        for sock in stalled:
            sock.close()
    assert (stats["cancelled_total"], stats["executed_total"]) == (2, 0)
    assert counters_add_up(stats)
    assert stats["http_connections_open"] == 1  # the httpx client's
    assert (await live.http.post("/generate", json={"inputs": "next"})).status_code == 200


@BOTH_PARSERS
async def test_a_slow_http_reader_that_keeps_reading_is_not_cut_off(
    start: Start, parser: str
) -> None:
    live = await start(max_body_bytes=32 << 20, write_timeout_s=0.5, parser=parser)
    text = "x" * (4 << 20)
    params = {"exec_ms": 100, "chunks": 4}
    request = post_request(
        "/generate_stream", {"inputs": text, "parameters": {"backend_params": params}}
    )

    def read_slowly() -> bytes:
        """As in test_tcp_limits: at most 64 KiB every 25 ms, until the server closes."""
        host, _, port = live.url.removeprefix("http://").rpartition(":")
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
            sock.connect((host, int(port)))
            sock.sendall(request.replace(b"host: x\r\n", b"host: x\r\nconnection: close\r\n"))
            sock.settimeout(30)
            received = bytearray()
            while data := sock.recv(65536):
                received += data
                time.sleep(0.025)
            return bytes(received)

    reply = await anyio.to_thread.run_sync(read_slowly)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    found = events(dechunk(body).decode())
    assert "".join(e["token"]["text"] for e in found) == text
    assert found[-1]["generated_text"] == text
    stats = await live.stats()
    assert (stats["http_connections_write_timeout_total"], stats["executed_total"]) == (0, 1)


def dechunk(body: bytes) -> bytes:
    """The payload of a chunked transfer-encoded body."""
    out = bytearray()
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            return bytes(out)
        out += body[:size]
        body = body[size + 2 :]


async def test_metrics_export_the_connection_counters(start: Start) -> None:
    live = await start()
    response = await live.http.get("/metrics")
    samples = {
        s.name: s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if not s.labels
    }
    for name in (
        "yieldgate_connections_open",
        "yieldgate_connections_write_timeout_total",
        "yieldgate_http_connections_refused_total",
        "yieldgate_http_connections_head_timeout_total",
        "yieldgate_http_connections_write_timeout_total",
        "yieldgate_http_body_timeouts_total",
    ):
        assert name in samples, name
    assert samples["yieldgate_http_connections_open"] == 1


def test_the_parser_is_httptools_when_installed_else_h11(monkeypatch: pytest.MonkeyPatch) -> None:
    assert HttpConfig().resolved_parser == "httptools"  # the server extra brings it
    assert HttpConfig(parser="h11").resolved_parser == "h11"
    real = importlib.util.find_spec

    def without_httptools(name: str, *args: Any) -> Any:
        return None if name == "httptools" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_httptools)
    assert HttpConfig().resolved_parser == "h11"
    with pytest.raises(ValueError, match="'httptools' is not installed"):
        HttpConfig(parser="httptools")
    with pytest.raises(ValueError, match="http parser must be"):
        HttpConfig(parser="picohttp")  # type: ignore[arg-type]


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_each_parser_has_a_guarded_protocol(parser: Parser) -> None:
    cls = protocol_class(parser)
    assert issubclass(cls, GuardedProtocol)
    assert parser.lower() in cls.__mro__[2].__module__.replace("_impl", "")

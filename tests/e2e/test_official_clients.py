"""The official openai and huggingface_hub clients, unmodified, under a Gate, against a real server.

Each test starts ``yieldgate serve`` with 4 slots and its HTTP front, fires
200 concurrent calls (streams among them) and checks that every one
succeeds while the server's ``inflight`` (sampled from ``/stats`` all along)
never passes 4. The cold-start tests start the server cold and ramping.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import httpx
import httpx2
import openai
import pytest
from huggingface_hub import AsyncInferenceClient, set_async_client_factory

import yieldgate
from yieldgate.server import ServerProcess, spawn

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

CALLS = 200
SLOTS = 4


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    extra: tuple[str, ...] = getattr(request, "param", ())
    with spawn("--max-inflight", str(SLOTS), "--exec-ms", "20", "--http-port", "0", *extra) as proc:
        yield proc


COLD = ("--cold-start-s", "1.0", "--ramp-s", "1.0")


class InflightSampler:
    """Polls the server's ``/stats`` (outside any Gate) while a run goes on."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.samples: list[int] = []
        self.last: dict[str, Any] = {}

    async def run(self, done: anyio.Event) -> None:
        async with httpx.AsyncClient(base_url=self.base_url) as client:
            while not done.is_set():
                stats = (await client.get("/stats")).json()
                self.samples.append(stats["inflight"])
                await anyio.sleep(0.005)
            self.last = (await client.get("/stats")).json()


async def run_concurrently(
    server: ServerProcess, calls: list[Callable[[], Awaitable[str]]]
) -> tuple[list[str | BaseException], InflightSampler]:
    assert server.http_url is not None
    sampler = InflightSampler(server.http_url)
    results: list[str | BaseException] = [RuntimeError("not run")] * len(calls)
    done = anyio.Event()

    async def one(i: int) -> None:
        try:
            results[i] = await calls[i]()
        except Exception as exc:
            results[i] = exc

    with anyio.fail_after(90):
        async with anyio.create_task_group() as outer:
            outer.start_soon(sampler.run, done)
            async with anyio.create_task_group() as tg:
                for i in range(len(calls)):
                    tg.start_soon(one, i)
            done.set()
    return results, sampler


def assert_all_succeeded(
    results: list[str | BaseException], expected: list[str], sampler: InflightSampler
) -> None:
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not failures, f"{len(failures)} failed, first: {failures[0]!r}"
    assert results == expected
    assert sampler.samples, "the sampler saw nothing"
    assert max(sampler.samples) <= SLOTS
    assert max(sampler.samples) >= 1
    assert sampler.last["inflight"] == 0
    assert sampler.last["executed_total"] == len(expected)


# -- openai ------------------------------------------------------------------------


def openai_client(server: ServerProcess, gate: yieldgate.Gate) -> openai.AsyncOpenAI:
    client: openai.AsyncOpenAI = yieldgate.openai_client(
        gate, base_url=f"{server.http_url}/v1", api_key="unused"
    )
    return client


def test_openai_client_is_openais_own_with_the_gates_http_client_and_no_retries() -> None:
    gate = yieldgate.Gate(name="openai")
    client = yieldgate.openai_client(gate, base_url="http://127.0.0.1:1/v1", api_key="k")
    assert type(client) is openai.AsyncOpenAI
    assert client.max_retries == 0
    assert type(yieldgate.openai_client(gate, sync=True, api_key="k")) is openai.OpenAI
    with pytest.raises(TypeError, match="max_retries"):
        yieldgate.openai_client(gate, api_key="k", max_retries=2)
    with pytest.raises(TypeError, match="http_client"):
        yieldgate.openai_client(gate, api_key="k", http_client=httpx.AsyncClient())


def chat_call(client: openai.AsyncOpenAI, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        messages: Any = [{"role": "user", "content": f"hello {i}"}]
        if i % 2:
            stream = await client.chat.completions.create(
                model="yieldgate-sim", messages=messages, stream=True
            )
            pieces = [
                chunk.choices[0].delta.content or ""
                async for chunk in stream
                if chunk.choices and chunk.choices[0].delta.content
            ]
            return "".join(pieces)
        reply = await client.chat.completions.create(model="yieldgate-sim", messages=messages)
        return reply.choices[0].message.content or ""

    return call


async def test_openai_client_200_concurrent_calls_all_succeed(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="openai")
    async with openai_client(server, gate) as client:
        calls = [chat_call(client, i) for i in range(CALLS)]
        results, sampler = await run_concurrently(server, calls)
    assert_all_succeeded(results, [f"user: hello {i}" for i in range(CALLS)], sampler)
    stats = gate.statistics()
    assert stats.calls_ok == CALLS
    assert stats.window.inflight == 0


@pytest.mark.parametrize("server", [COLD], indirect=True)
async def test_openai_client_rides_out_a_cold_start(server: ServerProcess) -> None:
    gate = yieldgate.Gate(yieldgate.GatePolicy.cold_start(), name="openai")
    async with openai_client(server, gate) as client:
        calls = [chat_call(client, i) for i in range(CALLS)]
        results, sampler = await run_concurrently(server, calls)
    assert_all_succeeded(results, [f"user: hello {i}" for i in range(CALLS)], sampler)
    assert sampler.last["yielded_total"] > 0  # it was cold, and it was ridden out


async def test_openai_gives_the_clients_own_error_when_the_gate_gives_up(
    server: ServerProcess,
) -> None:
    # Every slot held by long TCP submits: HTTP calls can only be yielded.
    holder_gate = yieldgate.Gate(
        yieldgate.GatePolicy(window=yieldgate.WindowPolicy.fixed(SLOTS)), name="holders"
    )
    url = server.url
    hold = functools.partial(holder_gate_submit, url, holder_gate)
    async with anyio.create_task_group() as tg:
        tg.start_soon(hold)
        with anyio.fail_after(10):
            while (await stats(server))["inflight"] < SLOTS:  # noqa: ASYNC110 - polls the server
                await anyio.sleep(0.02)
        gate = yieldgate.Gate(name="openai")
        # The slots free in 30 s: a call allowed 1 s stops at once (fail fast).
        client = yieldgate.openai_client(
            gate, timeout=1.0, base_url=f"{server.http_url}/v1", api_key="unused"
        )
        async with client:
            with pytest.raises(openai.RateLimitError) as info:
                await client.chat.completions.create(
                    model="yieldgate-sim", messages=[{"role": "user", "content": "x"}]
                )
        error = info.value.response.extensions["yieldgate_error"]
        assert isinstance(error, yieldgate.DeadlineExceededError)
        assert error.last_hint_s is not None
        assert error.last_hint_s > 1.0
        assert gate.statistics().window.inflight == 0
        tg.cancel_scope.cancel()  # the holders disconnect: their slots return


async def test_closing_the_openai_client_gives_back_a_stream_left_open(
    server: ServerProcess,
) -> None:
    gate = yieldgate.Gate(name="openai")
    client = openai_client(server, gate)
    messages: Any = [{"role": "user", "content": "a reply of several chunks"}]
    stream = await client.chat.completions.create(
        model="yieldgate-sim", messages=messages, stream=True
    )
    async for _chunk in stream:
        break  # the caller stops reading and keeps the stream
    assert gate.statistics().window.inflight == 1
    await client.close()
    assert gate.statistics().window.inflight == 0
    await stream.close()  # closed late: the slot was given back once, not twice
    assert gate.statistics().window.inflight == 0


async def holder_gate_submit(url: str, gate: yieldgate.Gate) -> None:
    async with (
        yieldgate.GovernedClient(url, gate=gate) as governed,
        anyio.create_task_group() as tg,
    ):
        for _ in range(SLOTS):
            tg.start_soon(functools.partial(governed.submit, "hold", params={"exec_ms": 30_000}))


async def stats(server: ServerProcess) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.http_url or "") as client:
        result: dict[str, Any] = (await client.get("/stats")).json()
        return result


# -- huggingface_hub -----------------------------------------------------------------


def hf_call(client: AsyncInferenceClient, i: int) -> Callable[[], Awaitable[str]]:
    async def call() -> str:
        if i % 2:
            tokens = await client.text_generation(f"prompt {i}", max_new_tokens=16, stream=True)
            return "".join([token async for token in tokens])
        return await client.text_generation(f"prompt {i}", max_new_tokens=16)

    return call


async def hf_run(
    server: ServerProcess, gate: yieldgate.Gate
) -> tuple[list[str | BaseException], InflightSampler]:
    async with AsyncInferenceClient(model=f"{server.http_url}/models/tiny") as client:
        return await run_concurrently(server, [hf_call(client, i) for i in range(CALLS)])


async def test_huggingface_client_200_concurrent_calls_all_succeed(server: ServerProcess) -> None:
    gate = yieldgate.Gate(name="hf")
    with yieldgate.huggingface_clients(gate):
        results, sampler = await hf_run(server, gate)
    assert_all_succeeded(results, [f"prompt {i}" for i in range(CALLS)], sampler)
    assert gate.statistics().calls_ok == CALLS


async def test_huggingface_clients_puts_back_the_factory_it_replaced(
    server: ServerProcess,
) -> None:
    made: list[str] = []

    def own_factory() -> httpx2.AsyncClient:
        made.append("own")
        return httpx2.AsyncClient()

    async def generate(prompt: str) -> str:
        async with AsyncInferenceClient(model=f"{server.http_url}/models/tiny") as client:
            return await client.text_generation(prompt, max_new_tokens=16)

    outer, inner = yieldgate.Gate(name="outer"), yieldgate.Gate(name="inner")
    # The outer block puts huggingface_hub's own factory back at the end.
    with yieldgate.huggingface_clients(outer):
        set_async_client_factory(own_factory)
        with yieldgate.huggingface_clients(inner):
            assert await generate("inside") == "inside"
        assert await generate("after") == "after"
        with pytest.raises(RuntimeError, match="boom"), yieldgate.huggingface_clients(inner):
            raise RuntimeError("boom")
        assert await generate("after an error") == "after an error"
    assert await generate("outside") == "outside"
    assert made == ["own", "own"]
    assert (inner.statistics().calls_ok, outer.statistics().calls_ok) == (1, 0)


@pytest.mark.parametrize("server", [COLD], indirect=True)
async def test_huggingface_client_rides_out_a_cold_start(server: ServerProcess) -> None:
    gate = yieldgate.Gate(yieldgate.GatePolicy.cold_start(), name="hf")
    with yieldgate.huggingface_clients(gate):
        results, sampler = await hf_run(server, gate)
    assert_all_succeeded(results, [f"prompt {i}" for i in range(CALLS)], sampler)
    # The loading model's 503s were read as cold-start yields, not failures.
    stats = gate.statistics()
    assert stats.yields > 0
    assert stats.failures == 0


# -- what the official clients read of each API (issue 18, items 4-6) --------------


def plain_openai(server: ServerProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)


async def test_openai_stop_fingerprint_and_models_retrieve(server: ServerProcess) -> None:
    async with plain_openai(server) as client:
        reply = await client.completions.create(
            model="yieldgate-sim", prompt="one two three four", stop=[" three", "x"]
        )
        assert reply.choices[0].text == "one two"
        assert reply.choices[0].finish_reason == "stop"
        assert reply.system_fingerprint
        chat = await client.chat.completions.create(
            model="yieldgate-sim", messages=[{"role": "user", "content": "a b. c"}], stop="."
        )
        assert chat.choices[0].message.content == "user: a b"
        assert chat.system_fingerprint == reply.system_fingerprint
        model = await client.models.retrieve("yieldgate-sim")
        assert (model.id, model.object, model.owned_by) == ("yieldgate-sim", "model", "yieldgate")
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("another-model")


@pytest.mark.parametrize(
    ("param", "kwargs"),
    [
        ("logprobs", {"logprobs": True, "top_logprobs": 2}),
        ("logprobs", {"logprobs": True}),
        ("top_p", {"top_p": 0.5}),
        ("response_format", {"response_format": {"type": "json_object"}}),
        (
            "tools",
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
        ),
        ("presence_penalty", {"presence_penalty": 0.5}),
    ],
)
async def test_openai_what_the_server_cannot_honour_is_a_bad_request(
    server: ServerProcess, param: str, kwargs: dict[str, Any]
) -> None:
    async with plain_openai(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="yieldgate-sim", messages=[{"role": "user", "content": "hi"}], **kwargs
            )
    assert caught.value.param == param
    assert caught.value.type == "invalid_request_error"
    # What asks for nothing is accepted as it is.
    async with plain_openai(server) as client:
        reply = await client.chat.completions.create(
            model="yieldgate-sim",
            messages=[{"role": "user", "content": "hi"}],
            logprobs=False,
            response_format={"type": "text"},
            presence_penalty=0,
            top_p=1.0,
        )
    assert reply.choices[0].message.content == "user: hi"


@pytest.mark.parametrize(
    ("param", "kwargs"), [("logprobs", {"logprobs": 0}), ("top_p", {"top_p": 0.2})]
)
async def test_openai_completions_refuse_what_the_simulated_backend_cannot_honour(
    server: ServerProcess, param: str, kwargs: dict[str, Any]
) -> None:
    async with plain_openai(server) as client:
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(model="yieldgate-sim", prompt="hi", **kwargs)
        assert caught.value.param == param
        assert caught.value.type == "invalid_request_error"
        assert "not supported" in caught.value.message
        with pytest.raises(openai.BadRequestError) as caught:
            await client.completions.create(
                model="yieldgate-sim", prompt="hi", stream=True, **kwargs
            )
        assert caught.value.param == param


async def test_huggingface_text_generation_details(server: ServerProcess) -> None:
    client = AsyncInferenceClient(model=f"{server.http_url}/models/sim")
    prompt = "one two three four"
    out = await client.text_generation(prompt, details=True, decoder_input_details=True, seed=7)
    assert out.generated_text == prompt
    details = out.details
    assert details is not None
    assert (details.finish_reason, details.generated_tokens, details.seed) == ("eos_token", 18, 7)
    assert "".join(t.text for t in details.tokens) == prompt
    assert "".join(t.text for t in details.prefill) == prompt
    # The served tokenizer is byte-level: a token's id is its UTF-8 byte.
    assert [t.id for t in details.tokens] == list(prompt.encode())
    again = await client.text_generation(prompt, details=True)
    assert again.details is not None
    assert again.details.prefill == []
    stopped = await client.text_generation(prompt, details=True, stop=[" three"])
    assert stopped.generated_text == "one two"
    assert stopped.details is not None
    assert stopped.details.finish_reason == "stop_sequence"
    assert await client.text_generation(prompt) == prompt
    streamed = [e async for e in await client.text_generation(prompt, details=True, stream=True)]
    # As in TGI, the last event carries the last piece of text with the whole of it.
    assert "".join(e.token.text for e in streamed) == streamed[-1].generated_text == prompt
    last = streamed[-1].details
    assert last is not None
    assert (last.finish_reason, last.generated_tokens, last.input_length) == ("eos_token", 18, 18)


async def test_huggingface_chat_completion_on_a_model_url(server: ServerProcess) -> None:
    client = AsyncInferenceClient(model=f"{server.http_url}/models/sim")
    messages = [{"role": "user", "content": "hello there"}]
    reply = await client.chat_completion(messages, max_tokens=32)
    assert reply.choices[0].message.content == "user: hello there"
    assert reply.choices[0].finish_reason == "stop"
    chunks = [c async for c in await client.chat_completion(messages, stream=True)]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "user: hello there"
    )
    assert chunks[-1].choices[0].finish_reason == "stop"

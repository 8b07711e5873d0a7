"""``yieldgate serve --backend harness``: the torch engine behind the Governor, end to end.

A real server process with the tiny transformer on CPU; clients are the SDK's
``GovernedClient``, the official ``openai`` client under a Gate, and a raw
NDJSON connection for what the protocol itself must show.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import openai
import pytest
from huggingface_hub import AsyncInferenceClient

import yieldgate
from tests.conftest import RawClient
from yieldgate.protocol import submit_frame
from yieldgate.server import ServerProcess, ServerStartError, spawn

torch = pytest.importorskip("torch")

from yieldgate.harness.model import ModelConfig, TinyTransformer  # noqa: E402 - needs torch

pytestmark = [pytest.mark.anyio, pytest.mark.e2e]

SLOTS = 4


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn(
        "--backend",
        "harness",
        "--max-inflight",
        str(SLOTS),
        "--kv-blocks",
        "256",
        "--http-port",
        "0",
        "--model-name",
        "tiny",
        ready_timeout=60,
    ) as proc:
        yield proc


async def wait_warm(server: ServerProcess) -> RawClient:
    client = await RawClient.connect(server)
    with anyio.fail_after(60):
        while (await client.stats())["cold"]:  # noqa: ASYNC110 - polls the server
            await anyio.sleep(0.05)
    return client


async def test_governed_stream_and_submit_agree(server: ServerProcess) -> None:
    async with yieldgate.GovernedClient(server.url) as client:
        prompt = "Tell me about backpressure."
        pieces: list[str] = []
        async with client.stream(prompt, params={"max_tokens": 24}) as chunks:
            async for data in chunks:
                pieces.append(data["text"])
            streamed = chunks.result
        assert len(pieces) > 1
        assert "".join(pieces) == streamed["text"]
        assert streamed["completion_tokens"] == 24
        assert streamed["ttft_ms"] > 0
        assert streamed["tpot_ms"] > 0
        whole = await client.submit(prompt, params={"max_tokens": 24})
        # Greedy: the same prompt gives the same tokens, and the second run
        # finds the prompt's full blocks in the prefix cache.
        assert whole["text"] == streamed["text"]
        assert whole["cached_tokens"] == 16


async def test_openai_client_streams_through_the_gate(server: ServerProcess) -> None:
    assert server.http_url is not None
    gate = yieldgate.Gate(name="harness")
    client = openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1",
        api_key="unused",
        http_client=yieldgate.http_client(gate, dialect="openai"),
        max_retries=0,
    )
    texts: dict[int, str] = {}
    streamed: dict[int, str] = {}

    async def whole(i: int) -> None:
        reply = await client.completions.create(
            model="tiny", prompt=f"request {i // 2 % 4}", max_tokens=12
        )
        texts[i] = reply.choices[0].text
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 12

    async def stream(i: int) -> None:
        events = await client.completions.create(
            model="tiny", prompt=f"request {i // 2 % 4}", max_tokens=12, stream=True
        )
        streamed[i] = "".join([event.choices[0].text async for event in events if event.choices])

    async with client:
        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for i in range(16):
                    tg.start_soon(stream if i % 2 else whole, i)
    assert len(texts) == 8
    assert len(streamed) == 8
    # Greedy decoding: a prompt's streamed text equals its whole text.
    for i, text in streamed.items():
        same_prompt = [texts[j] for j in texts if j // 2 % 4 == i // 2 % 4]
        assert same_prompt
        assert all(text == other for other in same_prompt)


async def test_openai_finish_reason_stop_and_one_token_per_event(server: ServerProcess) -> None:
    assert server.http_url is not None
    await (await wait_warm(server)).aclose()
    async with openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0
    ) as client:
        prompt = "Once upon a time"
        whole = await client.completions.create(model="tiny", prompt=prompt, max_tokens=24)
        assert whole.choices[0].finish_reason == "length"
        text = whole.choices[0].text
        events = await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=24, stream=True
        )
        chunks = [event async for event in events if event.choices]
        # One event per token (24), then the one that says why it ended.
        assert [c.choices[0].finish_reason for c in chunks] == [None] * 24 + ["length"]
        assert "".join(c.choices[0].text for c in chunks) == text
        # Greedy decoding repeats itself: a stop sequence taken from the middle
        # of the text ends the same generation just before it.
        start = next(i for i in range(4, len(text) - 2) if "\ufffd" not in text[i : i + 2])
        stop = text[start : start + 2]
        stopped = await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=24, stop=[stop]
        )
        assert stopped.choices[0].text == text[: text.index(stop)]
        assert stopped.choices[0].finish_reason == "stop"
        assert stopped.usage is not None
        assert stopped.usage.completion_tokens < 24


def openai_client(server: ServerProcess) -> openai.AsyncOpenAI:
    assert server.http_url is not None
    return openai.AsyncOpenAI(base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0)


def reference_logprobs(prompt: str, output: list[int]) -> torch.Tensor:
    """``log_softmax`` of the served model's logits at each output position (greedy: T = 1)."""
    model = TinyTransformer(ModelConfig())  # the server's: the default seeded weights
    tokens = list(prompt.encode()) + output
    logits = model.forward_full(torch.tensor(tokens[:-1]))
    return torch.log_softmax(logits[-len(output) :].float(), dim=-1)


def token_text(token_id: int) -> str:
    return chr(token_id) if token_id < 0x80 else f"bytes:\\x{token_id:02x}"


async def test_openai_chat_logprobs_whole_and_streamed(server: ServerProcess) -> None:
    await (await wait_warm(server)).aclose()
    messages: Any = [{"role": "user", "content": "Logprobs, s'il vous plaît: café"}]
    async with openai_client(server) as client:
        whole = await client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=16, logprobs=True, top_logprobs=3
        )
        events = await client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=16,
            logprobs=True,
            top_logprobs=3,
            stream=True,
        )
        chunks = [event async for event in events if event.choices]
    choice = whole.choices[0]
    assert choice.logprobs is not None
    assert choice.logprobs.refusal is None
    content = choice.logprobs.content
    assert content is not None
    assert len(content) == 16
    ids = [entry.bytes[0] for entry in content if entry.bytes]
    assert [entry.bytes for entry in content] == [[i] for i in ids]
    assert [entry.token for entry in content] == [token_text(i) for i in ids]
    # This prompt's greedy text has a byte that is no whole character.
    assert any(entry.token.startswith("bytes:\\x") for entry in content)
    assert bytes(ids).decode("utf-8", errors="replace") == choice.message.content
    expected = reference_logprobs("user: " + messages[0]["content"], ids)
    for row, entry in zip(expected, content, strict=True):
        assert entry.logprob == pytest.approx(float(row[entry.bytes[0]]), abs=1e-3)
        top = row.topk(3)
        assert [alt.bytes for alt in entry.top_logprobs] == [[i] for i in top.indices.tolist()]
        assert [alt.token for alt in entry.top_logprobs] == [
            token_text(i) for i in top.indices.tolist()
        ]
        assert [alt.logprob for alt in entry.top_logprobs] == pytest.approx(
            top.values.tolist(), abs=1e-3
        )
    # Streamed: each token's event carries its own entry, the last event none.
    streamed = [c.choices[0].logprobs for c in chunks]
    assert streamed[-1] is None
    assert all(
        lp is not None and lp.content is not None and len(lp.content) == 1 for lp in streamed[:-1]
    )
    assert [lp.content[0].token for lp in streamed[:-1] if lp and lp.content] == [
        entry.token for entry in content
    ]


async def test_openai_completions_logprobs_whole_and_streamed(server: ServerProcess) -> None:
    await (await wait_warm(server)).aclose()
    prompt = "The byte-level model says"
    async with openai_client(server) as client:
        whole = await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=20, logprobs=2
        )
        events = await client.completions.create(
            model="tiny", prompt=prompt, max_tokens=20, logprobs=2, stream=True
        )
        chunks = [event async for event in events if event.choices]
    choice = whole.choices[0]
    logprobs = choice.logprobs
    assert logprobs is not None
    assert logprobs.tokens is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    assert logprobs.text_offset is not None
    assert len(logprobs.tokens) == 20
    for token, logprob, top in zip(
        logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs, strict=True
    ):
        # The two most likely, and the sampled token (greedy: one of them).
        assert len(top) == 2
        assert top[token] == logprob
        assert logprob == max(top.values())
    offsets = logprobs.text_offset
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    assert all(offset <= len(choice.text) for offset in offsets)
    # Streamed: the same tokens, one per event, their offsets into the text so far.
    pieces = chunks[:-1]
    sent = 0
    for chunk, token, offset in zip(pieces, logprobs.tokens, offsets, strict=True):
        lp = chunk.choices[0].logprobs
        assert lp is not None
        assert lp.tokens == [token]
        assert lp.text_offset == [sent] == [offset]
        sent += len(chunk.choices[0].text)
    assert chunks[-1].choices[0].logprobs is None


async def test_openai_top_p_samples_repeatably_with_a_seed(server: ServerProcess) -> None:
    await (await wait_warm(server)).aclose()
    async with openai_client(server) as client:

        async def sample(top_p: float, seed: int) -> str:
            reply = await client.completions.create(
                model="tiny",
                prompt="Sample me",
                max_tokens=24,
                temperature=1.5,
                top_p=top_p,
                seed=seed,
            )
            return reply.choices[0].text

        first = await sample(0.8, 1)
        assert await sample(0.8, 1) == first
        # A nucleus this small holds only the most likely token: greedy.
        greedy = await client.completions.create(model="tiny", prompt="Sample me", max_tokens=24)
        assert await sample(1e-9, 2) == greedy.choices[0].text
        with pytest.raises(openai.BadRequestError) as caught:
            await sample(1.5, 1)
        assert caught.value.param == "top_p"


async def test_tgi_details_carry_the_byte_vocabulary(server: ServerProcess) -> None:
    assert server.http_url is not None
    await (await wait_warm(server)).aclose()
    client = AsyncInferenceClient(model=server.http_url)
    prompt = "héllo"
    out = await client.text_generation(
        prompt, max_new_tokens=10, details=True, decoder_input_details=True
    )
    details = out.details
    assert details is not None
    assert (details.finish_reason, details.generated_tokens) == ("length", 10)
    # The harness's vocabulary is bytes: the ids are the text's own bytes.
    assert [t.id for t in details.prefill] == list(prompt.encode())
    ids = bytes(t.id for t in details.tokens)
    assert ids.decode("utf-8", errors="replace") == out.generated_text
    streamed = [
        e
        async for e in await client.text_generation(
            prompt, max_new_tokens=10, stream=True, details=True
        )
    ]
    # One token per event, the last one's in the event that ends the stream, as in TGI.
    assert bytes(e.token.id for e in streamed) == ids
    last = streamed[-1].details
    assert last is not None
    assert (last.finish_reason, last.generated_tokens, last.input_length) == ("length", 10, 6)
    # Each generated token's log-probability is the harness's, whole and streamed, and the
    # same as the OpenAI route reports for the same greedy answer.
    whole = [t.logprob for t in details.tokens]
    assert all(lp is not None and lp <= 0 for lp in whole)
    assert [e.token.logprob for e in streamed] == pytest.approx(whole, abs=1e-6)
    async with openai_client(server) as openai_:
        reply = await openai_.completions.create(
            model="tiny", prompt=prompt, max_tokens=10, logprobs=0
        )
    assert reply.choices[0].logprobs is not None
    assert reply.choices[0].logprobs.token_logprobs == pytest.approx(whole, abs=1e-6)


async def test_the_exported_tokenizer_counts_what_the_harness_counts(
    server: ServerProcess, tmp_path: Path
) -> None:
    transformers = pytest.importorskip("transformers")
    from yieldgate.server.tokenizer import write_tokenizer

    write_tokenizer(tmp_path, model_name="tiny", model_max_length=2048)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert server.http_url is not None
    await (await wait_warm(server)).aclose()
    prompt = "Tokens: ñ 日本"
    async with openai.AsyncOpenAI(
        base_url=f"{server.http_url}/v1", api_key="unused", max_retries=0
    ) as client:
        reply = await client.completions.create(model="tiny", prompt=prompt, max_tokens=12)
    assert reply.usage is not None
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (
        len(tokenizer.encode(prompt)),
        12,
    )
    # The ids the harness generated are the tokenizer's: they decode to its text (a byte that
    # is no whole character, to U+FFFD, as the server decodes it).
    parameters = {"max_new_tokens": 12, "details": True, "decoder_input_details": True}
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        answer = (
            await http.post("/generate", json={"inputs": prompt, "parameters": parameters})
        ).json()
    details = answer["details"]
    assert [t["id"] for t in details["prefill"]] == tokenizer.encode(prompt)
    ids = [t["id"] for t in details["tokens"]]
    assert len(ids) == details["generated_tokens"] == 12
    assert tokenizer.decode(ids) == answer["generated_text"] == reply.choices[0].text


async def test_a_full_engine_yields_at_once_with_an_honest_hint(server: ServerProcess) -> None:
    client = await wait_warm(server)
    try:
        # Fill every slot with a long generation, then ask once more.
        rids = []
        for _ in range(SLOTS):
            rid = client.next_id()
            rids.append(rid)
            await client.send(submit_frame(rid, "hold a slot", params={"max_tokens": 900}))
        with anyio.fail_after(10):
            while (await client.stats())["backend"]["running"] < SLOTS:  # noqa: ASYNC110
                await anyio.sleep(0.01)
        reply = await client.submit("one more", params={"max_tokens": 4})
        assert reply["status"] == "yield"
        # Four generations of 900 tokens have far more than a step left: the hint
        # comes from the engine's measured speed, not a constant.
        assert reply["retry_hint_ms"] > 100
        stats = await client.stats()
        assert stats["inflight"] == SLOTS
    finally:
        await client.aclose()
    # The disconnect cancels the four generations and frees their KV blocks.
    probe = await RawClient.connect(server)
    try:
        with anyio.fail_after(10):
            while True:
                stats = await probe.stats()
                if stats["inflight"] == 0 and stats["backend"]["kv_blocks_used"] == 0:
                    break
                await anyio.sleep(0.02)
        assert stats["backend"]["running"] == 0
    finally:
        await probe.aclose()


async def test_bad_parameters_cost_no_slot(server: ServerProcess) -> None:
    client = await wait_warm(server)
    try:
        before = await client.stats()
        reply = await client.submit("x", params={"max_tokens": 0})
        assert reply["status"] == "error"
        assert reply["code"] == "backend_error"
        assert reply["retryable"] is False
        assert "max_tokens" in reply["message"]
        after = await client.stats()
        assert after["admitted_total"] == before["admitted_total"]
    finally:
        await client.aclose()


def test_cli_refuses_bad_harness_flags() -> None:
    with pytest.raises(ServerStartError, match="device") as caught:
        spawn("--backend", "harness", "--device", "tpu", ready_timeout=30)
    assert caught.value.returncode == 2
    assert "device" in caught.value.stderr


async def test_stats_report_the_engine(server: ServerProcess) -> None:
    client = await wait_warm(server)
    try:
        stats: dict[str, Any] = (await client.stats())["backend"]
    finally:
        await client.aclose()
    assert stats["device"] == "cpu"
    assert stats["kv_blocks_total"] == 256
    assert stats["decode_step_ms"] > 0


async def test_a_request_arriving_mid_stream_finishes_first(server: ServerProcess) -> None:
    received = 0
    short: dict[str, Any] = {}
    async with yieldgate.GovernedClient(server.url) as client:

        async def late() -> None:
            short.update(await client.submit("quick", params={"max_tokens": 4}))

        async with (
            client.stream("a long story", params={"max_tokens": 400}) as chunks,
            anyio.create_task_group() as tg,
        ):
            async for _ in chunks:
                received += 1
                if received == 5:
                    tg.start_soon(late)
                if short:
                    break
    # The short request joined the running batch and finished while the long one
    # was still generating.
    assert short["completion_tokens"] == 4
    assert received < 400


async def test_disaggregated_server_with_qos_and_a_live_router_config(tmp_path: Path) -> None:
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"prefill_length_threshold": 100_000}))
    proc = spawn(
        "--backend",
        "harness",
        "--max-inflight",
        "8",
        "--prefill-workers",
        "1",
        "--router-config",
        str(config),
        "--qos",
        "--slo-ttft-ms",
        "1,none,none",
        "--max-num-batched-tokens",
        "1100",
        ready_timeout=60,
    )
    try:
        client = await wait_warm(proc)
        try:
            # A prefill queue: six 1,000-token prompts, one prefill step each.
            long_ids = []
            for i in range(6):
                rid = client.next_id()
                long_ids.append(rid)
                body = f"{i} " + "x" * 998
                await client.send(submit_frame(rid, body, params={"max_tokens": 20}))
            with anyio.fail_after(20):
                while (await client.stats())["backend"]["waiting"] < 2:  # noqa: ASYNC110
                    await anyio.sleep(0.005)
            low = await client.submit("low", priority="low", params={"max_tokens": 2})
            assert low["status"] == "yield"
            assert low["reason"] == "slo"
            assert low["retry_hint_ms"] >= 1
            high = await client.submit("high", priority="high", params={"max_tokens": 2})
            assert high["status"] == "ok"
            for rid in long_ids:
                reply = await client.recv_for(rid, timeout=60)
                assert reply["status"] == "ok"
            stats = await client.stats()
            assert stats["backend"]["qos"]["rejected"]["low"] >= 1
            assert stats["backend"]["remote_prefills"] == 0
            # Lower the threshold in the file: the router picks it up without a restart.
            config.write_text(
                json.dumps({"prefill_length_threshold": 64, "busy_length_threshold": 32})
            )
            with anyio.fail_after(20):
                for n in range(1_000):
                    # A fresh prompt each time: a cached prefix would keep it local.
                    reply = await client.submit(f"{n:04d}" + "y" * 300, params={"max_tokens": 2})
                    assert reply["status"] == "ok"
                    stats = (await client.stats())["backend"]
                    if stats["remote_prefills"]:
                        break
                    await anyio.sleep(0.2)
            assert stats["router"]["config_reloads"] >= 1
            assert stats["prefill_workers"][0]["transfers"] >= 1
        finally:
            await client.aclose()
    finally:
        proc.stop()


async def test_degradation_and_the_planner_from_the_command_line() -> None:
    proc = spawn(
        "--backend",
        "harness",
        "--max-inflight",
        "4",
        "--degrade",
        "--planner",
        "--slo-ttft-ms",
        "400,1500,none",
        "--slo-tpot-ms",
        "50",
        ready_timeout=60,
    )
    try:
        client = await wait_warm(proc)
        try:
            backend = (await client.stats())["backend"]
        finally:
            await client.aclose()
    finally:
        proc.stop()
    assert backend["degrade"]["level"] == -1  # idle: no overload
    planner = backend["planner"]["config"]
    assert (planner["ttft_ms"], planner["tpot_ms"]) == (1500.0, 50.0)
    assert (planner["max_prefill_workers"], planner["max_decode_seqs"]) == (2, 4)
    assert planner["long_prompt_tokens"] == 128  # the router's threshold
    assert backend["prefill_workers_active"] == 0  # the planner starts colocated


async def test_a_chunked_prefill_server_answers_as_the_unchunked_one(
    server: ServerProcess,
) -> None:
    """``--prefill-chunk``: a prompt computed 8 tokens a step, beside a running stream,
    gives the tokens the unchunked server gives."""
    prompt = "A prompt of some length, so that it takes several pieces: " * 3
    params = {"max_tokens": 16}
    plain = await wait_warm(server)
    try:
        expected = await plain.submit(prompt, params=params)
    finally:
        await plain.aclose()
    proc = spawn("--backend", "harness", "--max-inflight", "4", "--prefill-chunk", "8")
    try:
        client = await wait_warm(proc)
        try:
            before = (await client.stats())["backend"]
            assert before["prefill_chunk"] == 8
            # A long request decoding while the prompt's pieces run.
            beside = client.next_id()
            await client.send(submit_frame(beside, "decoding beside it", params={"max_tokens": 64}))
            got = await client.submit(prompt, params=params)
            assert (await client.recv_for(beside, timeout=60))["status"] == "ok"
            after = (await client.stats())["backend"]
        finally:
            await client.aclose()
    finally:
        proc.stop()
    assert got["status"] == expected["status"] == "ok"
    assert got["result"]["text"] == expected["result"]["text"]
    pieces = -(-len(prompt.encode()) // 8)
    assert after["prefill_steps"] - before["prefill_steps"] >= pieces

"""``POST /v1/messages`` in a real ``yieldgate serve`` process, through the unmodified SDK.

The simulated backend echoes the prompt the route builds (a ``system: ...``
line, then one ``role: text`` line per message), so every reply's text and
token counts are known in advance: a token is a byte. Clients never retry
(``max_retries=0``): every error the server sends is the one the test sees.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import pytest

from tests.conftest import http_stats, stats_when
from yieldgate.dialects import get_dialect
from yieldgate.server import ServerProcess, spawn

pytestmark = pytest.mark.e2e

MODEL = "claude-rehearsal"


def client(server: ServerProcess, **kwargs: Any) -> anthropic.Anthropic:
    kwargs.setdefault("api_key", "unused")
    return anthropic.Anthropic(base_url=server.http_url, max_retries=0, **kwargs)


def nbytes(text: str) -> int:
    return len(text.encode("utf-8"))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with spawn("--http-port", "0", "--exec-ms", "5", http=True) as proc:
        yield proc


def test_a_whole_reply_with_a_system_prompt_and_content_blocks(server: ServerProcess) -> None:
    with client(server) as api:
        message = api.messages.create(
            model=MODEL,
            max_tokens=200,
            system="Be brief.",
            messages=[
                {"role": "user", "content": "Hello"},
                {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Say "}, {"type": "text", "text": "ok"}],
                },
            ],
            metadata={"user_id": "u-1"},
        )
    prompt = "system: Be brief.\nuser: Hello\nassistant: Hi!\nuser: Say ok"
    assert isinstance(message, anthropic.types.Message)
    assert message.id.startswith("msg_")
    assert (message.type, message.role, message.model) == ("message", "assistant", MODEL)
    assert len(message.content) == 1
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == prompt
    assert (message.stop_reason, message.stop_sequence) == ("end_turn", None)
    assert (message.usage.input_tokens, message.usage.output_tokens) == (
        nbytes(prompt),
        nbytes(prompt),
    )


def test_a_system_prompt_of_text_blocks(server: ServerProcess) -> None:
    with client(server) as api:
        message = api.messages.create(
            model=MODEL,
            max_tokens=100,
            system=[{"type": "text", "text": "One. "}, {"type": "text", "text": "Two."}],
            messages=[{"role": "user", "content": "é"}],
        )
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == "system: One. Two.\nuser: é"
    assert message.usage.input_tokens == nbytes("system: One. Two.\nuser: é")


def test_a_stop_sequence_ends_the_reply_and_is_named(server: ServerProcess) -> None:
    with client(server) as api:
        message = api.messages.create(
            model=MODEL,
            max_tokens=100,
            messages=[{"role": "user", "content": "one two three four"}],
            stop_sequences=["four", " three"],
        )
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == "user: one two"
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", " three")
    assert message.usage.output_tokens == nbytes("user: one two")


def test_max_tokens_cuts_the_reply(server: ServerProcess) -> None:
    with client(server) as api:
        message = api.messages.create(
            model=MODEL, max_tokens=7, messages=[{"role": "user", "content": "a long answer"}]
        )
    block = message.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == "user: a"
    assert (message.stop_reason, message.stop_sequence) == ("max_tokens", None)
    assert message.usage.output_tokens == 7


def test_a_stream_parsed_by_the_sdks_message_stream(server: ServerProcess) -> None:
    prompt = "user: stream me, " + "x" * 40
    with (
        client(server) as api,
        api.messages.stream(
            model=MODEL,
            max_tokens=30,
            messages=[{"role": "user", "content": prompt[len("user: ") :]}],
            extra_body={"backend_params": {"chunks": 5}},
        ) as stream,
    ):
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) == 5
    assert "".join(pieces) == prompt[:30]
    block = final.content[0]
    assert isinstance(block, anthropic.types.TextBlock)
    assert block.text == prompt[:30]
    assert final.id.startswith("msg_")
    assert (final.stop_reason, final.stop_sequence) == ("max_tokens", None)
    assert (final.usage.input_tokens, final.usage.output_tokens) == (nbytes(prompt), 30)


def test_a_stream_with_stream_true_yields_anthropics_events_in_order(
    server: ServerProcess,
) -> None:
    with client(server) as api:
        events = list(
            api.messages.create(
                model=MODEL,
                max_tokens=100,
                messages=[{"role": "user", "content": "hi there"}],
                stop_sequences=["there"],
                stream=True,
                extra_body={"backend_params": {"chunks": 1}},
            )
        )
    kinds = [event.type for event in events]
    assert kinds == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]  # the SDK skips the ping
    start = events[0]
    assert isinstance(start, anthropic.types.RawMessageStartEvent)
    assert start.message.content == []
    assert start.message.stop_reason is None
    assert start.message.usage.input_tokens == nbytes("user: hi there")
    delta = events[2]
    assert isinstance(delta, anthropic.types.RawContentBlockDeltaEvent)
    assert isinstance(delta.delta, anthropic.types.TextDelta)
    assert delta.delta.text == "user: hi "
    end = events[4]
    assert isinstance(end, anthropic.types.RawMessageDeltaEvent)
    assert (end.delta.stop_reason, end.delta.stop_sequence) == ("stop_sequence", "there")
    assert end.usage.output_tokens == nbytes("user: hi ")


def test_the_wire_events_are_named_and_typed_alike_with_a_ping(server: ServerProcess) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 50,
        "messages": [{"role": "user", "content": "abc"}],
        "stream": True,
    }
    with httpx.stream("POST", f"{server.http_url}/v1/messages", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        text = reply.read().decode()
    events = [chunk.split("\n") for chunk in text.strip().split("\n\n")]
    names = []
    for lines in events:
        assert lines[0].startswith("event: ")
        assert lines[1].startswith("data: ")
        name, data = lines[0][len("event: ") :], json.loads(lines[1][len("data: ") :])
        assert data["type"] == name
        names.append(name)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}


@pytest.mark.anyio
async def test_the_async_client_streams_too(server: ServerProcess) -> None:
    async with (
        anthropic.AsyncAnthropic(base_url=server.http_url, api_key="unused", max_retries=0) as api,
        api.messages.stream(
            model=MODEL, max_tokens=64, messages=[{"role": "user", "content": "async"}]
        ) as stream,
    ):
        text = "".join([piece async for piece in stream.text_stream])
        final = await stream.get_final_message()
    assert text == "user: async"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens == nbytes("user: async")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (
            {"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]': content blocks of type 'image'",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}],
                    }
                ]
            },
            "type 'tool_result'",
        ),
        ({"system": [{"type": "document", "source": {}}]}, "system[0]': content blocks"),
        ({"tools": [{"name": "t", "input_schema": {"type": "object"}}]}, "'tools'"),
        ({"tool_choice": {"type": "any"}}, "'tool_choice'"),
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "'thinking'"),
        ({"top_k": 5}, "'top_k'"),
        ({"top_p": 0.5}, "'top_p' is not supported by this server's backend"),
        ({"cache_control": {"type": "ephemeral"}}, "'cache_control'"),
        ({"no_such_field": 1}, "'no_such_field': extra inputs are not permitted"),
        ({"max_tokens": None}, "'max_tokens' is required"),
        ({"max_tokens": 0}, "'max_tokens': 0"),
        ({"model": None}, "'model' is required"),
        ({"messages": []}, "'messages' must be a non-empty array"),
        ({"messages": [{"role": "system", "content": "x"}]}, "'messages[0].role'"),
        ({"stop_sequences": ["a", "b", "c", "d", "e"]}, "'stop_sequences': at most 4"),
        ({"temperature": 1.5}, "'temperature' must be a number in [0, 1]"),
    ],
)
def test_what_no_backend_here_does_is_a_400_naming_it(
    server: ServerProcess, fields: dict[str, Any], named: str
) -> None:
    body: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 10,
        "messages": [{"role": "user", "content": "x"}],
        **fields,
    }
    body = {k: v for k, v in body.items() if v is not None}
    with client(server) as api, pytest.raises(anthropic.BadRequestError) as caught:
        api.post("/v1/messages", cast_to=anthropic.types.Message, body=body)
    assert caught.value.status_code == 400
    error: Any = caught.value.body
    assert error == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": error["error"]["message"]},
    }
    assert named in error["error"]["message"]
    assert caught.value.response.headers["x-should-retry"] == "false"


def test_fields_that_ask_for_nothing_are_accepted(server: ServerProcess) -> None:
    with client(server) as api:
        message = api.messages.create(
            model=MODEL,
            max_tokens=20,
            messages=[{"role": "user", "content": "fine"}],
            tool_choice={"type": "auto"},
            tools=[],
            thinking={"type": "disabled"},
            service_tier="auto",
            # Fields this SDK release no longer has as arguments: sent as the API takes them.
            extra_body={"temperature": 0.0, "top_p": 1},
        )
    assert message.stop_reason == "end_turn"


def test_an_unknown_path_under_messages_is_anthropics_404(server: ServerProcess) -> None:
    with client(server) as api, pytest.raises(anthropic.NotFoundError) as caught:
        api.messages.batches.list()
    assert caught.value.body is not None
    assert caught.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]


def test_a_body_over_the_limit_is_anthropics_413(serve: Any) -> None:
    small: ServerProcess = serve("--http-port", "0", "--exec-ms", "5", "--max-body-bytes", "1000")
    with client(small) as api, pytest.raises(anthropic.APIStatusError) as caught:
        api.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "x" * 5000}]
        )
    assert caught.value.status_code == 413
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "request_too_large",
            "message": "request body exceeds max_body_bytes=1000",
        },
    }


def test_a_failure_after_the_stream_began_is_an_error_event(server: ServerProcess) -> None:
    with client(server) as api:
        stream = api.messages.create(
            model=MODEL,
            max_tokens=50,
            messages=[{"role": "user", "content": "doomed"}],
            stream=True,
            extra_body={"backend_params": {"fail": True, "chunks": 2}},
        )
        seen: list[str] = []

        def read_all() -> None:
            seen.extend(event.type for event in stream)

        with pytest.raises(anthropic.APIStatusError) as caught:
            read_all()
    assert seen[0] == "message_start"
    assert "message_stop" not in seen
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "simulated backend failure"},
    }


def test_with_a_secret_the_sdks_api_key_is_accepted(serve: Any, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret\n")
    guarded: ServerProcess = serve(
        "--http-port", "0", "--exec-ms", "5", "--secret-file", str(secret_file)
    )
    request: Any = {"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    with client(guarded, api_key="s3cret") as api:  # sent as x-api-key
        assert api.messages.create(**request).stop_reason == "max_tokens"
    with client(guarded, api_key=None, auth_token="s3cret") as api:  # Authorization: Bearer
        assert api.messages.create(**request).stop_reason == "max_tokens"
    with client(guarded, api_key="wrong") as api, pytest.raises(anthropic.AuthenticationError) as e:
        api.messages.create(**request)
    assert e.value.body is not None
    assert e.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]


@pytest.mark.anyio
async def test_a_yield_is_a_529_overloaded_error_with_the_hint(serve: Any) -> None:
    full: ServerProcess = serve("--http-port", "0", "--max-inflight", "1", "--exec-ms", "5")
    assert full.http_url is not None

    async def read() -> dict[str, Any]:
        return await anyio.to_thread.run_sync(http_stats, full)

    async with anthropic.AsyncAnthropic(
        base_url=full.http_url, api_key="unused", max_retries=0
    ) as api:
        request: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "x"}],
        }
        async with anyio.create_task_group() as tg:
            hold = {"backend_params": {"exec_ms": 30_000}}
            tg.start_soon(lambda: api.messages.create(**request, extra_body=hold))
            await stats_when(read, lambda s: s["inflight"] == 1)
            with pytest.raises(anthropic.InternalServerError) as caught:
                await api.messages.create(**request)
            tg.cancel_scope.cancel()  # the holder leaves: its slot frees
        await stats_when(read, lambda s: s["inflight"] == 0)
    error = caught.value
    assert isinstance(error, anthropic.OverloadedError)
    assert error.status_code == 529
    assert isinstance(error.body, dict)
    assert error.body["type"] == "error"
    assert error.body["error"]["type"] == "overloaded_error"
    assert error.body["status"] == "yield"  # the governed fields ride along
    hint_ms = error.body["retry_hint_ms"]
    assert int(error.response.headers["retry-after-ms"]) == hint_ms > 0
    assert int(error.response.headers["retry-after"]) == -(-hint_ms // 1000)
    outcome = get_dialect("anthropic").classify(error.response)
    assert (outcome.kind, outcome.reason) == ("yield", "overloaded")
    assert outcome.hint_s == pytest.approx(hint_ms / 1000)

"""Every error the HTTP front answers is in the shape of its API family (issue 41, item 4).

OpenAI's ``{"error": {"message", "type", "param", "code"}}``, Anthropic's
``{"type": "error", "error": {"type", "message"}}``, the HuggingFace Inference
API's ``{"error": "..."}`` and TGI's ``{"error": "...", "error_type": "..."}``,
on every route and for every kind of error: an unknown path (404, with a hint
at the base URL meant), a wrong method (405), a bad body (400/422), a body too
large (413), a head too large (431), no secret (401), a yield (429/529), a
failure (503/500) and a deadline (504). Then the official clients, against a
real ``yieldgate serve`` process, show the server's message.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anthropic
import anyio
import httpx
import huggingface_hub
import openai
import pytest

from tests.conftest import RawClient, stats_when, submit
from yieldgate.server import (
    Governor,
    GovernorConfig,
    HttpConfig,
    Server,
    ServerProcess,
    SimulatedBackend,
    SimulatedConfig,
    TcpConfig,
    Work,
    spawn,
)
from yieldgate.server._http_guard import MAX_HEAD_BYTES
from yieldgate.server.backends import BackendError, Emit

pytestmark = pytest.mark.anyio

MAX_BODY = 512
CHAT = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}]}
TGI = {"inputs": "x"}

# Every inference route: (path, family, a valid body).
ROUTES: list[tuple[str, str, dict[str, Any]]] = [
    ("/v1/chat/completions", "openai", CHAT),
    ("/v1/completions", "openai", {"model": "m", "prompt": "x"}),
    ("/v1/responses", "openai", {"model": "m", "input": "x"}),
    ("/openai/deployments/d/chat/completions", "openai", CHAT),
    ("/models/org/m/v1/chat/completions", "openai", CHAT),
    ("/v1/messages", "anthropic", MESSAGES),
    ("/models/org/m", "huggingface", TGI),
    ("/generate", "tgi", TGI),
    ("/generate_stream", "tgi", TGI),
    ("/", "tgi", TGI),
]
ROUTE_IDS = [path for path, _, _ in ROUTES]

# Anthropic's error type for each status, as its error reference lists them.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def message_of(family: str, status: int, body: Any) -> str:
    """The message of ``body``, asserting it is in ``family``'s error shape."""
    assert isinstance(body, dict), body
    if family == "openai":
        error = body["error"]
        assert isinstance(error, dict), body
        assert {"message", "type", "param", "code"} <= set(error), body
        assert isinstance(error["type"], str), body
        message = error["message"]
    elif family == "anthropic":
        assert body["type"] == "error", body
        error = body["error"]
        assert isinstance(error, dict), body
        expected = ANTHROPIC_TYPES.get(status, "invalid_request_error")
        assert error["type"] == expected, body
        message = error["message"]
    elif family == "huggingface":
        # An error_type would make huggingface_hub raise a TGI error without the status.
        assert "error_type" not in body, body
        message = body["error"]
    else:
        assert family == "tgi"
        assert isinstance(body["error_type"], str), body
        message = body["error"]
    assert isinstance(message, str), body
    assert message, body
    return message


def with_backend_params(family: str, body: dict[str, Any], params: Any) -> dict[str, Any]:
    if family in ("openai", "anthropic"):
        return {**body, "backend_params": params}
    return {**body, "parameters": {"backend_params": params}}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A real ``yieldgate serve`` process with an HTTP front, its bodies capped small."""
    with spawn("--exec-ms", "1", "--max-body-bytes", str(MAX_BODY), http=True) as proc:
        yield proc


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[httpx.AsyncClient]:
    assert server.http_url is not None
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as client:
        yield client


# -- every route, every kind of error ---------------------------------------------------


def invalid_status(path: str) -> int:
    return 422 if path in ("/generate", "/generate_stream", "/") else 400


@pytest.mark.parametrize(("path", "family", "body"), ROUTES, ids=ROUTE_IDS)
async def test_every_route_answers_errors_in_its_familys_shape(
    http: httpx.AsyncClient, path: str, family: str, body: dict[str, Any]
) -> None:
    wrong_fields = {"model": 3, "messages": 4, "prompt": 5, "inputs": 6, "input": 7}
    cases: list[tuple[str, int, dict[str, Any]]] = [
        ("bad json", invalid_status(path), {"content": b"{not json"}),
        ("bad fields", invalid_status(path), {"json": wrong_fields}),
        ("too large", 413, {"json": {**body, "pad": "x" * MAX_BODY}}),
        ("no time left", 504, {"json": body, "headers": {"x-yieldgate-deadline-ms": "0"}}),
        ("backend failed", 503, {"json": with_backend_params(family, body, {"fail": True})}),
        ("wrong method", 405, {"method": "GET"}),
        ("wrong method", 405, {"method": "DELETE"}),
    ]
    for kind, status, request in cases:
        method = request.pop("method", "POST")
        response = await http.request(method, path, **request)
        if path == "/generate_stream" and kind == "backend failed":
            # A stream fails after its first event: the last event is the error.
            assert response.status_code == 200, response.text
            last = response.text.strip().rsplit("\n", 1)[-1].removeprefix("data:")
            message_of(family, 500, json.loads(last))
            continue
        assert response.status_code == status, (kind, response.text)
        assert response.headers["content-type"] == "application/json", kind
        expected = family
        if method == "GET" and path.startswith("/models/"):
            expected = "openai"  # GET /v1/models/{model_id} meant (openai's models.retrieve)
        message_of(expected, status, response.json())


@pytest.mark.parametrize(
    ("method", "path", "family", "meant"),
    [
        # An OpenAI client whose base URL lacks /v1.
        ("POST", "/chat/completions", "openai", "Did you mean POST /v1/chat/completions?"),
        ("POST", "/completions", "openai", "Did you mean POST /v1/completions?"),
        ("POST", "/responses", "openai", "Did you mean POST /v1/responses?"),
        ("GET", "/models", "openai", "Did you mean GET /v1/models?"),
        ("POST", "/api/v1/chat/completions", "openai", "has '/api' too many"),
        ("POST", "/api/chat/completions", "openai", "has '/api' where '/v1' belongs"),
        ("POST", "/v1/embeddings", "openai", "the routes are"),
        ("POST", "/openai/deployments/d/completions", "openai", "the routes are"),
        # An anthropic client whose base URL ends in /v1 (it adds /v1 itself).
        ("POST", "/v1/v1/messages", "anthropic", "the anthropic client adds '/v1' itself"),
        ("POST", "/messages", "anthropic", "Did you mean POST /v1/messages?"),
        ("POST", "/v1/messages/batches", "anthropic", "the routes are"),
        ("POST", "/v1/messages/count_tokens", "anthropic", "the routes are"),
        # TGI and HuggingFace clients, and the server's own routes.
        ("POST", "/generate/", "tgi", "Did you mean POST /generate?"),
        ("POST", "/info", "huggingface", "the routes are"),
        ("POST", "/model/m", "huggingface", "/models/{model_id}"),
        ("GET", "/health/", "huggingface", "Did you mean GET /health?"),
    ],
)
async def test_an_unknown_path_is_a_404_in_the_shape_of_the_route_meant(
    http: httpx.AsyncClient, method: str, path: str, family: str, meant: str
) -> None:
    response = await http.request(method, path)
    assert response.status_code == 404, response.text
    message = message_of(family, 404, response.json())
    assert message.startswith(f"Invalid URL ({method} {path})"), message
    assert meant in message
    if family != "anthropic":
        code = response.json()["error"]["code"] if family == "openai" else response.json()["code"]
        assert code == "unknown_op"


@pytest.mark.parametrize(
    ("method", "path", "family", "meant"),
    [
        ("GET", "/v1/chat/completions", "openai", None),
        ("POST", "/v1/models", "openai", None),
        ("GET", "/v1/messages", "anthropic", None),
        ("GET", "/generate", "tgi", None),
        ("GET", "/", "tgi", None),
        ("POST", "/health", "huggingface", None),
        # openai's models.retrieve() without /v1: the HuggingFace route takes only POST.
        ("GET", "/models/m", "openai", "Did you mean GET /v1/models/m?"),
    ],
)
async def test_a_wrong_method_is_a_405_in_the_shape_of_the_route_meant(
    http: httpx.AsyncClient, method: str, path: str, family: str, meant: str | None
) -> None:
    response = await http.request(method, path)
    assert response.status_code == 405, response.text
    assert response.headers["allow"]
    message = message_of(family, 405, response.json())
    assert message.startswith(f"Method not allowed ({method} {path})"), message
    if meant is not None:
        assert meant in message


def test_a_head_past_the_cap_is_a_431_in_the_shape_of_its_path(server: ServerProcess) -> None:
    # The server parses with httptools (the server extra), whose cap is the guard's own.
    pytest.importorskip("httptools")
    assert server.http_address is not None
    for path, family in [("/v1/chat/completions", "openai"), ("/v1/messages", "anthropic")]:
        head = f"POST {path} HTTP/1.1\r\nhost: x\r\nx-big: ".encode() + b"a" * (MAX_HEAD_BYTES + 1)
        with socket.create_connection(server.http_address, timeout=30) as sock:
            sock.sendall(head)  # never finished
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        status_line, _, rest = answer.partition(b"\r\n")
        assert status_line.startswith(b"HTTP/1.1 431 "), answer
        assert b"content-type: application/json" in rest.lower()
        message = message_of(family, 431, json.loads(rest.partition(b"\r\n\r\n")[2]))
        assert str(MAX_HEAD_BYTES) in message


async def test_without_the_secret_every_route_is_a_401_in_its_shape(
    serve: Any, tmp_path: Path
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("correct horse\n")
    server: ServerProcess = serve("--http-port", "0", "--secret-file", str(secret))
    assert server.http_url is not None
    requests = [("POST", path, family, body) for path, family, body in ROUTES] + [
        ("GET", "/v1/models", "openai", None),
        ("GET", "/v1/models/m", "openai", None),
        ("GET", "/stats", "huggingface", None),
        ("GET", "/v1/chat/completions", "openai", None),  # a route, the wrong method
        ("POST", "/chat/completions", "openai", CHAT),  # no such route
        ("POST", "/v1/v1/messages", "anthropic", MESSAGES),
        ("GET", "/nothing", "huggingface", None),
    ]
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        for method, path, family, body in requests:
            response = await http.request(method, path, json=body)
            assert response.status_code == 401, (method, path, response.text)
            message = message_of(family, 401, response.json())
            assert "Did you mean" not in message  # nothing is told without the secret


async def test_a_yield_is_in_each_routes_shape(serve: Any, connect: Any) -> None:
    server: ServerProcess = serve("--http-port", "0", "--max-inflight", "1", "--exec-ms", "1")
    assert server.http_url is not None
    holder: RawClient = await connect(server)
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:

        async def stats() -> dict[str, Any]:
            read: dict[str, Any] = (await http.get("/stats")).json()
            return read

        await holder.send(submit("hold", params={"exec_ms": 60_000}))
        await stats_when(stats, lambda s: s["inflight"] == 1)
        for path, family, body in ROUTES:
            response = await http.post(path, json=body)
            status = 529 if family == "anthropic" else 429
            assert response.status_code == status, (path, response.text)
            reply = response.json()
            message_of(family, status, reply)
            assert reply["status"] == "yield"
        await holder.aclose()  # the slot frees
        await stats_when(stats, lambda s: s["inflight"] == 0)


# -- failures inside the server (in-process: a backend that breaks) ---------------------


class BreakingBackend(SimulatedBackend):
    """The simulated backend, failing as ``backend_params.mode`` says."""

    async def execute(self, work: Work, emit: Emit | None) -> Any:
        if work.params.get("mode") == "fatal":
            raise BackendError("the model is broken", retryable=False)
        return await super().execute(work, emit)


async def test_a_failure_inside_the_server_is_a_500_in_each_shape() -> None:
    backend = BreakingBackend(SimulatedConfig(exec_ms=1))
    server = Server(
        Governor(GovernorConfig(max_inflight=4)),
        backend,
        tcp=TcpConfig(port=0),
        http=HttpConfig(port=0),
    )
    async with anyio.create_task_group() as tg:
        await tg.start(lambda task_status: server.run(task_status=task_status))
        try:
            async with httpx.AsyncClient(base_url=server.urls[1], timeout=30) as http:
                for path, family, body in ROUTES:
                    fatal = with_backend_params(family, body, {"mode": "fatal"})
                    response = await http.post(path, json=fatal)
                    assert response.status_code == 500, (path, response.text)
                    assert response.headers["x-should-retry"] == "false"
                    message_of(family, 500, response.json())
                # A bug in a route of the server's own: not starlette's text/plain 500.
                front = server.http
                assert front is not None

                def broken() -> dict[str, Any]:
                    raise RuntimeError("a bug")

                front.stats = broken  # type: ignore[method-assign]
                crashed = await http.get("/stats")
                assert crashed.status_code == 500, crashed.text
                assert crashed.headers["x-should-retry"] == "false"
                assert message_of("huggingface", 500, crashed.json()) == "internal error"
        finally:
            server.request_stop(hard=True)


# -- the official clients show the server's message -------------------------------------


def test_openai_without_v1_shows_the_servers_hint(server: ServerProcess) -> None:
    assert server.http_url is not None
    with openai.OpenAI(base_url=server.http_url, api_key="k", max_retries=0) as client:
        with pytest.raises(openai.NotFoundError) as caught:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.NotFoundError, match=r"Did you mean GET /v1/models\?"):
            client.models.list()
    message = str(caught.value)
    assert message != "Error code: 404"
    assert "Did you mean POST /v1/chat/completions?" in message
    assert "lacks '/v1'" in message
    assert caught.value.type == "invalid_request_error"


def test_anthropic_with_v1_in_its_base_url_shows_the_servers_hint(server: ServerProcess) -> None:
    assert server.http_url is not None
    client = anthropic.Anthropic(base_url=f"{server.http_url}/v1", api_key="k", max_retries=0)
    with client, pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    body = caught.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "the anthropic client adds '/v1' itself" in str(caught.value)


def test_huggingface_hub_with_a_wrong_model_url_shows_the_servers_message(
    server: ServerProcess,
) -> None:
    assert server.http_url is not None
    client = huggingface_hub.InferenceClient(model=f"{server.http_url}/model/m")
    with pytest.raises(huggingface_hub.errors.HfHubHTTPError) as caught:
        client.text_generation("x", max_new_tokens=4)
    message = str(caught.value)
    assert "Invalid URL (POST /model/m)" in message
    assert "/models/{model_id}" in message

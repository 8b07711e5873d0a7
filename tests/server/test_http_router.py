"""InferenceRouter: a POST an inference route matches goes to its Inference, as
starlette's router would send it; everything else to the app behind."""

from __future__ import annotations

from typing import Any, cast

import pytest
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from yieldgate.server._http_inference import Inference
from yieldgate.server._http_router import InferenceRouter

pytestmark = pytest.mark.anyio


class Recorder:
    """An ASGI app that records what it was called with."""

    def __init__(self, name: str, calls: list[tuple[str, Any]]) -> None:
        self.name = name
        self.calls = calls

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.calls.append((self.name, scope.get("path_params")))


async def endpoint(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("never called: the router takes these routes")


def router(calls: list[tuple[str, Any]]) -> InferenceRouter:
    paths = [
        "/v1/chat/completions",
        "/models/{model_id:path}/v1/chat/completions",
        "/models/{model_id:path}",
        "/generate",
        "/models/exact",  # the route before matches it first
    ]
    routes = [
        (Route(path, endpoint, methods=["POST"]), cast(Inference, Recorder(path, calls)))
        for path in paths
    ]
    return InferenceRouter(routes, Recorder("app", calls))


def http(method: str, path: str, root_path: str = "") -> Scope:
    return {"type": "http", "method": method, "path": path, "root_path": root_path}


async def nothing() -> Any:
    raise AssertionError("not read")


async def ignore(message: Any) -> None:
    raise AssertionError("not sent")


@pytest.mark.parametrize(
    ("scope", "expected"),
    [
        (http("POST", "/generate"), ("/generate", None)),
        (http("POST", "/v1/chat/completions"), ("/v1/chat/completions", None)),
        (
            http("POST", "/models/org/m/v1/chat/completions"),
            ("/models/{model_id:path}/v1/chat/completions", {"model_id": "org/m"}),
        ),
        (http("POST", "/models/org/m"), ("/models/{model_id:path}", {"model_id": "org/m"})),
        (http("POST", "/models/exact"), ("/models/{model_id:path}", {"model_id": "exact"})),
        # starlette's "$" matches before a final newline (a path with %0A): so does the router.
        (http("POST", "/generate\n"), ("/generate", {})),
        (http("POST", "/api/generate", root_path="/api"), ("/generate", {})),
        (http("GET", "/generate"), ("app", None)),  # the app answers 405
        (http("POST", "/generate/"), ("app", None)),  # and 404
        (http("POST", "/health"), ("app", None)),
        ({"type": "websocket", "path": "/generate"}, ("app", None)),
    ],
)
async def test_each_request_goes_where_starlette_would_send_it(
    scope: Scope, expected: tuple[str, Any]
) -> None:
    calls: list[tuple[str, Any]] = []
    await router(calls)(scope, nothing, ignore)
    assert calls == [expected]


def test_an_inference_route_takes_post_only() -> None:
    route = Route("/generate", endpoint, methods=["GET", "POST"])
    with pytest.raises(ValueError, match="POST only"):
        InferenceRouter([(route, cast(Inference, Recorder("x", [])))], Recorder("app", []))

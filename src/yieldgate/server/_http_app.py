"""The starlette app behind ``HttpFront``, and the uvicorn server that runs it.

Routes (see ``docs`` and ``_http_dialects`` for the bodies):

- OpenAI: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/responses``,
  ``GET /v1/models``, ``GET /v1/models/{model_id}``
- Azure OpenAI: ``POST /openai/deployments/{deployment}/chat/completions``
- Anthropic: ``POST /v1/messages``
- HuggingFace Inference API: ``POST /models/{model_id}``, and OpenAI's chat
  completions at ``POST /models/{model_id}/v1/chat/completions``, as HF endpoints serve them
- TGI: ``POST /generate``, ``POST /generate_stream``, ``POST /``
- ``GET /health``, ``GET /stats``, ``GET /metrics``

Every inference route reads the body (at most ``max_body_bytes``, within
``body_timeout_s``, else 413 or 408), parses it in its dialect, and asks the
shared ``Admission``: a yield is a 429 (Anthropic's route: 529
``overloaded_error``) with ``retry-after-ms`` and ``retry-after``, an
admitted request executes while the connection is watched (a client
that leaves cancels its work at once), and a stream holds its slot until
its last event is sent. With a secret, every route but
``/health`` first checks ``Authorization: Bearer <secret>`` (401 otherwise).

uvicorn only serves the connections here: the front accepts them itself, each
with a guarded protocol (``_http_guard``).

Here: ``build_app``, which puts the routes together around a ``Front`` (what
the app needs of the front, ``_http_front``). The parts: an inference route is
``_http_inference`` (its own secret check and request count), reached
without starlette through ``_http_router``; the other routes are
starlette's, behind the secret check and the request counts of
``_http_middleware``; a request no route takes (404, 405) is answered in
the shape of the API it was meant for (``_http_unknown``), and a bug in a
route in its route's; the JSON answers they share are ``_http_responses``,
and the uvicorn server (``make_uvicorn``, ``guarded_protocol``, re-exported
here) ``_http_uvicorn``.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import ASGIApp

from yieldgate import __version__
from yieldgate.protocol import ErrorCode
from yieldgate.server._http_dialects import (
    AnthropicMessages,
    ChatCompletions,
    Completions,
    Dialect,
    HfModels,
    TgiGenerate,
    dumps,
)
from yieldgate.server._http_front import Front
from yieldgate.server._http_inference import Inference
from yieldgate.server._http_metrics import CONTENT_TYPE, MetricsExporter
from yieldgate.server._http_middleware import Counted, RequireSecret, Secret
from yieldgate.server._http_openai_more import AzureChatCompletions, Responses
from yieldgate.server._http_responses import (
    MESSAGES_PATH,
    NO_RETRY,
    Family,
    path_family,
    route_error,
)
from yieldgate.server._http_router import InferenceRouter
from yieldgate.server._http_unknown import RouteTable
from yieldgate.server._http_uvicorn import _Uvicorn as _Uvicorn
from yieldgate.server._http_uvicorn import guarded_protocol, make_uvicorn

__all__ = ["build_app", "guarded_protocol", "make_uvicorn"]


def build_app(front: Front) -> ASGIApp:
    """The ASGI app for ``front``: every route, counted."""
    created = int(time.time())
    ids = itertools.count(1)
    backend_stats = getattr(front.backend, "stats", None)
    metrics = MetricsExporter(
        front.governor.stats,
        front.requests,
        backend_stats if callable(backend_stats) else None,
        front.all_connection_stats,
    )

    secret = None if front.config.secret is None else Secret(front.config.secret, front)

    def guarded(endpoint: Any) -> Any:
        """The route's endpoint, behind the secret when there is one."""
        if secret is None:
            return endpoint
        return RequireSecret(request_response(endpoint), secret)

    # What OpenAI's system_fingerprint stands for: the serving configuration.
    fingerprint = f"yieldgate-{__version__}-{front.backend.name}"

    inference_routes: list[tuple[Route, Inference]] = []

    def inference(path: str, dialect: Dialect) -> Route:
        """An inference route: the router answers it (``_http_router``), counted by
        its ``Inference``; starlette only answers its other methods (405)."""
        route = Route(path, _not_routed, methods=["POST"])
        inference_routes.append(
            (route, Inference(front, dialect, ids, route=route.path_format, secret=secret))
        )
        return route

    def json_response(status: int, body: Any) -> Response:
        return Response(dumps(body), status_code=status, media_type="application/json")

    served = {
        "id": front.config.model_name,
        "object": "model",
        "created": created,
        "owned_by": "yieldgate",
    }

    async def models(request: Request) -> Response:
        return json_response(200, {"object": "list", "data": [served]})

    async def model(request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id == served["id"]:
            return json_response(200, served)
        front.governor.record_error(ErrorCode.UNKNOWN_OP)
        message = f"The model '{model_id}' does not exist"
        error = {
            "message": message,
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        return json_response(404, {"error": error})

    async def health(request: Request) -> Response:
        gov = front.governor
        if gov.shutting_down:
            return json_response(503, {"status": "shutting_down"})
        if gov.is_cold:
            return json_response(503, {"status": "loading"})
        return json_response(200, {"status": "ok"})

    async def stats(request: Request) -> Response:
        return json_response(200, front.stats())

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def unknown(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        path = request.url.path
        # In the shape of the family the request was meant for (``_http_unknown``).
        answer = table.unknown(request.method, path, exc.status_code)
        if secret is not None and not secret.admits(request.scope):
            # Without the secret, nothing (not even which routes exist) is told.
            refusal, headers = secret.refusal(path, answer.family)
            return Response(
                refusal,
                status_code=401,
                media_type="application/json",
                headers={k.decode(): v.decode() for k, v in headers},
            )
        front.governor.record_error(ErrorCode.UNKNOWN_OP)
        body = route_error(
            path, ErrorCode.UNKNOWN_OP, answer.message, exc.status_code, answer.family
        )
        response = json_response(exc.status_code, body)
        response.headers.update(exc.headers or {})
        return response

    async def crashed(request: Request, exc: Exception) -> Response:
        # A bug in a route; starlette re-raises it after this answer, so it is logged.
        front.governor.record_error(ErrorCode.BACKEND_ERROR)
        path = request.url.path
        route = getattr(request.scope.get("route"), "path_format", None)
        family = table.family_of(route, path)
        body = route_error(path, ErrorCode.BACKEND_ERROR, "internal error", 500, family)
        response = json_response(500, body)
        response.headers[NO_RETRY[0].decode()] = NO_RETRY[1].decode()
        return response

    routes = [
        inference("/v1/chat/completions", ChatCompletions(fingerprint)),
        inference("/v1/completions", Completions(fingerprint)),
        inference("/v1/responses", Responses(fingerprint)),
        inference(MESSAGES_PATH, AnthropicMessages()),
        inference(
            "/openai/deployments/{model_id}/chat/completions", AzureChatCompletions(fingerprint)
        ),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", guarded(model), methods=["GET"]),
        inference("/models/{model_id:path}/v1/chat/completions", ChatCompletions(fingerprint)),
        inference("/models/{model_id:path}", HfModels()),
        inference("/generate", TgiGenerate(stream=False)),
        inference("/generate_stream", TgiGenerate(stream=True)),
        inference("/", TgiGenerate(stream=None)),
        Route("/health", health, methods=["GET"]),  # open: probes carry no secret
        Route("/stats", guarded(stats), methods=["GET"]),
        Route("/metrics", guarded(prometheus), methods=["GET"]),
    ]
    table = RouteTable([(route, _family(route, inference_routes)) for route in routes])
    app = Starlette(routes=routes, exception_handlers={HTTPException: unknown, Exception: crashed})
    app.router.redirect_slashes = False
    return InferenceRouter(inference_routes, Counted(app, front.requests))


def _family(route: Route, inference_routes: list[tuple[Route, Inference]]) -> Family:
    """The family whose shape ``route``'s errors take: its dialect's, OpenAI's for
    ``/v1/models``, TGI's (``{"error", "error_type"}``) for the server's own."""
    for inference_route, inference in inference_routes:
        if inference_route is route:
            return inference.dialect.family
    return path_family(route.path)


async def _not_routed(request: Request) -> Response:
    # InferenceRouter takes every request an inference route matches.
    raise RuntimeError(f"{request.url.path} should have been answered by its Inference")

"""The starlette app behind ``HttpFront``, and the uvicorn server that runs it.

Routes (see ``docs`` and ``_http_dialects`` for the bodies):

- OpenAI: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``GET /v1/models``
- HuggingFace Inference API: ``POST /models/{model_id}``
- TGI: ``POST /generate``, ``POST /generate_stream``, ``POST /``
- ``GET /health``, ``GET /stats``, ``GET /metrics``

Every inference route reads the body (at most ``max_body_bytes``, within
``body_timeout_s``, else 413 or 408), parses it in its dialect, and asks the
shared ``Admission``: a yield is a 429 with ``retry-after-ms`` and
``retry-after``, an admitted request executes while the connection is
watched (a client that leaves cancels its work at once), and a stream holds
its slot until its last event is sent. With a secret, every route but
``/health`` first checks ``Authorization: Bearer <secret>`` (401 otherwise).

uvicorn only serves the connections here: the front accepts them itself, each
with a guarded protocol (``_http_guard``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from yieldgate._headers import (
    AUTHORIZATION_HEADER,
    CACHE_CONTROL_HEADER,
    CONNECTION_HEADER,
    CONTENT_LENGTH_HEADER,
    CONTENT_TYPE_HEADER,
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    SHOULD_RETRY_HEADER,
    WWW_AUTHENTICATE_HEADER,
    X_ACCEL_BUFFERING_HEADER,
)
from yieldgate.protocol import MAX_DEADLINE_MS, ErrorCode, Priority, parse_priority
from yieldgate.server._http_config import HttpConfig
from yieldgate.server._http_dialects import (
    BadRequest,
    ChatCompletions,
    Completions,
    Dialect,
    HfModels,
    Job,
    TgiGenerate,
    chunk_text,
    dumps,
    loads,
    result_text,
    retry_after_s,
    usage_of,
)
from yieldgate.server._http_guard import ConnectionGuard, GuardedH11Protocol
from yieldgate.server._http_metrics import CONTENT_TYPE, MetricsExporter
from yieldgate.server.admission import Admission, Admitted, Failure, Finish, R
from yieldgate.server.backends import Backend, Emit
from yieldgate.server.governor import Governor, Slot, Yield

__all__ = ["Front", "build_app", "guarded_protocol", "make_uvicorn"]

log = logging.getLogger("yieldgate.server")

_INTEGER = re.compile(r"-?[0-9]{1,20}")
# A body past the limit is still read (and dropped) up to this many times the
# limit, so that the client, still sending, gets to read the 413.
_DRAIN_FACTOR = 16
_JSON = (CONTENT_TYPE_HEADER.encode(), b"application/json")
_SSE_HEADERS = [
    (CONTENT_TYPE_HEADER.encode(), b"text/event-stream; charset=utf-8"),
    (CACHE_CONTROL_HEADER.encode(), b"no-cache"),
    (X_ACCEL_BUFFERING_HEADER.encode(), b"no"),
]
_RETRY = (SHOULD_RETRY_HEADER.encode(), b"true")
_NO_RETRY = (SHOULD_RETRY_HEADER.encode(), b"false")
_CLOSE = (CONNECTION_HEADER.encode(), b"close")
_BEARER_CHALLENGE = (WWW_AUTHENTICATE_HEADER.encode(), b"Bearer")
_AUTHORIZATION = AUTHORIZATION_HEADER.encode()
_CONTENT_LENGTH = CONTENT_LENGTH_HEADER.encode()
_RETRY_AFTER_MS = RETRY_AFTER_MS_HEADER.encode()
_RETRY_AFTER = RETRY_AFTER_HEADER.encode()


class _TooLarge(Exception):
    pass


class Front(Protocol):
    """What the app needs of the front that serves it (``yieldgate.server.http.HttpFront``).

    Described here, not imported: the front imports this module when it
    starts serving, and this module must not import the front back.
    """

    config: HttpConfig
    governor: Governor
    backend: Backend
    admission: Admission
    requests: Counter[tuple[str, str]]  # (route, status) -> count
    body_timeouts: int

    def stats(self) -> dict[str, Any]: ...

    def all_connection_stats(self) -> dict[str, int]: ...

    async def run_admitted(
        self, admitted: Admitted, receive: Receive, emit: Emit | None, finish: Finish[R]
    ) -> R | Failure | None: ...


async def _send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    raw_headers = [_JSON, (_CONTENT_LENGTH, str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _priority(request: Request) -> Priority:
    value = request.headers.get(PRIORITY_HEADER)
    if value is None:
        return Priority.NORMAL
    priority = parse_priority(value)  # any case: a header is not a frame
    if priority is None:
        raise BadRequest(f"header {PRIORITY_HEADER} must be high, normal or low")
    return priority


def _deadline_ms(request: Request) -> int | None:
    value = request.headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    value = value.strip()
    if not _INTEGER.fullmatch(value) or abs(int(value)) > MAX_DEADLINE_MS:
        raise BadRequest(f"header {DEADLINE_HEADER} must be an integer number of milliseconds")
    return int(value)


async def _read_body(request: Request, limit: int) -> bytes:
    """The whole body, or ``_TooLarge`` once past ``limit``.

    The rest of a body that is too large is still read and dropped (up to
    ``_DRAIN_FACTOR`` times the limit), so that a client still sending it
    gets to read the 413 instead of a reset connection.
    """
    length = request.headers.get(CONTENT_LENGTH_HEADER, "")
    if length.isdigit() and int(length) > limit * _DRAIN_FACTOR:
        raise _TooLarge
    body = bytearray()
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total <= limit:
            body += chunk
        elif total > limit * _DRAIN_FACTOR:
            break
    if total > limit:
        raise _TooLarge
    return bytes(body)


class _Inference:
    """One inference route: an ASGI app that speaks ``dialect`` over the shared Admission."""

    def __init__(self, front: Front, dialect: Dialect, ids: Iterator[int]) -> None:
        self.front = front
        self.dialect = dialect
        self._ids = ids

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._handle(scope, receive, tracked)
        except Exception:
            # Everything expected is answered in _handle; this is a bug, not a crash.
            log.exception("handling %s %s failed", scope["method"], scope["path"])
            if not started:
                await self._fail(send, 500, ErrorCode.BACKEND_ERROR, "internal error", False)

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        front, dialect = self.front, self.dialect
        request = Request(scope, receive)
        try:
            with anyio.fail_after(front.config.body_timeout_s):
                raw = await _read_body(request, front.config.max_body_bytes)
        except ClientDisconnect:
            return
        except _TooLarge:
            message = f"request body exceeds max_body_bytes={front.config.max_body_bytes}"
            await self._fail(send, 413, ErrorCode.FRAME_TOO_LARGE, message, False, close=True)
            return
        except TimeoutError:
            # A body that stalls must not hold the connection (and its descriptor)
            # for ever; nothing was admitted, so sending it again may succeed.
            front.body_timeouts += 1
            message = f"request body did not arrive within {front.config.body_timeout_s:g} s"
            await self._fail(send, 408, ErrorCode.BAD_FRAME, message, True, close=True)
            return
        try:
            priority = _priority(request)
            deadline_ms = _deadline_ms(request)
            model_id = scope.get("path_params", {}).get("model_id")
            job = dialect.parse(loads(raw), model_id, front.config.model_name)
        except BadRequest as exc:
            await self._fail(send, dialect.invalid_status, ErrorCode.BAD_FRAME, exc.message, False)
            return
        decision = front.admission.admit(
            f"http-{next(self._ids)}",
            job.prompt,
            params=job.params,
            priority=priority,
            stream=job.stream,
            deadline_ms=deadline_ms,
        )
        if isinstance(decision, Admitted):
            if job.stream:
                await self._stream(receive, send, job, decision)
            else:
                await self._unary(receive, send, job, decision)
        elif isinstance(decision, Failure):
            await self._failure(send, decision)
        else:
            await self._yield(send, job, decision)

    # -- answers --------------------------------------------------------------

    def _status(self, failure: Failure) -> int:
        if failure.invalid:
            return self.dialect.invalid_status
        if failure.code is ErrorCode.DEADLINE_EXCEEDED:
            return 504
        if failure.code is ErrorCode.SHUTTING_DOWN:
            return 503
        if failure.code is ErrorCode.BACKEND_ERROR and failure.retryable:
            return 503
        return 500

    async def _failure(self, send: Send, failure: Failure) -> None:
        retryable = failure.retryable
        if retryable is None:
            retryable = failure.code.default_retryable
        await self._fail(send, self._status(failure), failure.code, failure.message, retryable)

    async def _fail(
        self,
        send: Send,
        status: int,
        code: ErrorCode,
        message: str,
        retryable: bool,
        *,
        close: bool = False,
    ) -> None:
        self.front.governor.record_error(code)
        headers = [_RETRY if retryable else _NO_RETRY]
        if close:
            headers.append(_CLOSE)
        await _send_json(send, status, dumps(self.dialect.error(status, code, message)), headers)

    async def _yield(self, send: Send, job: Job, refusal: Yield) -> None:
        cold = self.dialect.cold_start(job, refusal)
        if cold is not None:
            await _send_json(send, 503, dumps(cold))
            return
        body = {
            **self.dialect.yield_fields(refusal),
            "status": "yield",
            "retry_hint_ms": refusal.retry_hint_ms,
            "inflight": refusal.inflight,
            "max_inflight": refusal.max_inflight,
            "reason": str(refusal.reason),
        }
        headers = [
            (_RETRY_AFTER_MS, str(refusal.retry_hint_ms).encode()),
            (_RETRY_AFTER, str(retry_after_s(refusal.retry_hint_ms)).encode()),
            _RETRY,
        ]
        await _send_json(send, 429, dumps(body), headers)

    # -- admitted work ----------------------------------------------------------

    async def _unary(self, receive: Receive, send: Send, job: Job, admitted: Admitted) -> None:
        dialect = self.dialect

        async def finish(result: Any, slot: Slot) -> bytes:
            text, prompt_tokens, completion_tokens = result_text(result)
            usage = usage_of(job, text, prompt_tokens, completion_tokens)
            return dumps(dialect.ok(job, text, usage))

        outcome = await self.front.run_admitted(admitted, receive, None, finish)
        if outcome is None:
            return  # the client left; its work was cancelled
        if isinstance(outcome, Failure):
            await self._failure(send, outcome)
        else:
            await _send_json(send, 200, outcome)

    async def _stream(self, receive: Receive, send: Send, job: Job, admitted: Admitted) -> None:
        dialect = self.dialect
        index = 0
        started = False

        async def start() -> None:
            nonlocal started
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})

        async def emit(data: Any) -> None:
            nonlocal index
            event = dialect.piece(job, index, chunk_text(data))
            index += 1
            await start()
            await send({"type": "http.response.body", "body": event, "more_body": True})

        async def finish(result: Any, slot: Slot) -> str:
            text, prompt_tokens, completion_tokens = result_text(result)
            usage = usage_of(job, text, prompt_tokens, completion_tokens)
            events = dialect.end(job, index, text, usage)
            await start()
            await send({"type": "http.response.body", "body": events, "more_body": False})
            return text

        outcome = await self.front.run_admitted(admitted, receive, emit, finish)
        if not isinstance(outcome, Failure):
            return  # complete, or the client left
        if not started:
            # Nothing was sent yet: a plain error response, with its status.
            await self._failure(send, outcome)
            return
        self.front.governor.record_error(outcome.code)
        event = dialect.stream_error(self._status(outcome), outcome.code, outcome.message)
        await send({"type": "http.response.body", "body": event, "more_body": False})


def _route_error(path: str, code: ErrorCode, message: str, status: int) -> dict[str, Any]:
    """An error body for ``path`` when no dialect handled it: OpenAI's shape under
    ``/v1/``, the HuggingFace / TGI shape elsewhere."""
    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code.value}}
    return {"error": message, "error_type": code.value, "code": code.value}


class _Secret:
    """``Authorization: Bearer <secret>``, checked in constant time.

    It is what the official clients send from their ``api_key`` (openai) or
    ``token`` (huggingface_hub).
    """

    def __init__(self, secret: str, front: Front) -> None:
        self._secret = secret.encode("utf-8")
        self._front = front

    def admits(self, scope: Scope) -> bool:
        token = b""
        for name, value in scope["headers"]:
            if name == _AUTHORIZATION:
                scheme, _, token = value.strip().partition(b" ")
                if scheme.lower() != b"bearer":
                    token = b""
                break
        return hmac.compare_digest(token.strip(), self._secret)

    def refusal(self, path: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The 401's body and headers, counted as an ``unauthorized`` error."""
        self._front.governor.record_error(ErrorCode.UNAUTHORIZED)
        message = "missing or wrong bearer token (Authorization: Bearer <secret>)"
        body = dumps(_route_error(path, ErrorCode.UNAUTHORIZED, message, 401))
        return body, [_NO_RETRY, _BEARER_CHALLENGE]


class _RequireSecret:
    """An ASGI app that answers 401 to a request without the secret, else runs ``app``.

    A class, not a function: starlette takes a function endpoint for a
    request handler.
    """

    def __init__(self, app: ASGIApp, secret: _Secret) -> None:
        self.app = app
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.secret.admits(scope):
            await self.app(scope, receive, send)
            return
        body, headers = self.secret.refusal(scope["path"])
        await _send_json(send, 401, body, headers)


class _Counted:
    """Counts answered requests by route and status, for ``/metrics`` and ``/stats``."""

    def __init__(self, app: ASGIApp, counts: Counter[tuple[str, str]]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = "499"  # nginx's "client closed request": no response was started

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path_format", "unmatched")
            self.counts[(route, status)] += 1


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

    secret = None if front.config.secret is None else _Secret(front.config.secret, front)

    def guarded(endpoint: Any) -> Any:
        """The route's endpoint, behind the secret when there is one."""
        if secret is None:
            return endpoint
        app = endpoint if isinstance(endpoint, _Inference) else request_response(endpoint)
        return _RequireSecret(app, secret)

    def inference(dialect: Dialect) -> Any:
        return guarded(_Inference(front, dialect, ids))

    def json_response(status: int, body: Any) -> Response:
        return Response(dumps(body), status_code=status, media_type="application/json")

    async def models(request: Request) -> Response:
        model = {
            "id": front.config.model_name,
            "object": "model",
            "created": created,
            "owned_by": "yieldgate",
        }
        return json_response(200, {"object": "list", "data": [model]})

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
        if secret is not None and not secret.admits(request.scope):
            # Without the secret, nothing (not even which routes exist) is told.
            body, headers = secret.refusal(path)
            return Response(
                body,
                status_code=401,
                media_type="application/json",
                headers={k.decode(): v.decode() for k, v in headers},
            )
        front.governor.record_error(ErrorCode.UNKNOWN_OP)
        message = f"{request.method} {path}: {exc.detail}"
        response = json_response(
            exc.status_code, _route_error(path, ErrorCode.UNKNOWN_OP, message, exc.status_code)
        )
        response.headers.update(exc.headers or {})
        return response

    post = ["POST"]
    routes = [
        Route("/v1/chat/completions", inference(ChatCompletions()), methods=post),
        Route("/v1/completions", inference(Completions()), methods=post),
        Route("/v1/models", guarded(models), methods=["GET"]),
        Route("/models/{model_id:path}", inference(HfModels()), methods=post),
        Route("/generate", inference(TgiGenerate(stream=False)), methods=post),
        Route("/generate_stream", inference(TgiGenerate(stream=True)), methods=post),
        Route("/", inference(TgiGenerate(stream=None)), methods=post),
        Route("/health", health, methods=["GET"]),  # open: probes carry no secret
        Route("/stats", guarded(stats), methods=["GET"]),
        Route("/metrics", guarded(prometheus), methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: unknown})
    app.router.redirect_slashes = False
    return _Counted(app, front.requests)


class _Uvicorn(uvicorn.Server):
    """uvicorn without listeners, signal handlers or polling delays.

    The front accepts connections itself and hands each to a guarded protocol
    (``guarded_protocol``), so this server only serves them: it reports when
    it is ready, ends its main loop as soon as it is asked to (uvicorn polls
    every 100 ms) and shuts down without uvicorn's fixed pauses: close idle
    connections (busy ones close after their response), wait up to the
    graceful timeout, then cancel what is left.
    """

    def __init__(self, config: uvicorn.Config, on_started: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_started = on_started
        self._exit = anyio.Event()

    def request_exit(self) -> None:
        self.should_exit = True
        self._exit.set()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The process owner (the CLI) handles SIGINT/SIGTERM through Server.request_stop.
        yield

    async def startup(self, sockets: Any = None) -> None:
        # No lifespan (it is off) and no listener of uvicorn's own.
        self.servers = []
        self.started = True
        self._on_started()

    async def main_loop(self) -> None:
        counter = 0
        while not await self.on_tick(counter):  # once a second: the date header
            counter = (counter + 1) % 864_000
            with anyio.move_on_after(0.1):
                await self._exit.wait()

    async def shutdown(self, sockets: Any = None) -> None:
        state = self.server_state
        for connection in list(state.connections):
            connection.shutdown()
        with anyio.move_on_after(self.config.timeout_graceful_shutdown or 0):
            # uvicorn's connection and task sets have no event to wait on.
            while state.connections or state.tasks:  # noqa: ASYNC110
                await anyio.sleep(0.005)
        for task in list(state.tasks):
            task.cancel()


def make_uvicorn(app: ASGIApp, close_timeout_s: int, on_started: Callable[[], None]) -> _Uvicorn:
    """A uvicorn server for ``app``: it serves the connections ``guarded_protocol`` is given."""
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        ws="none",
        timeout_graceful_shutdown=close_timeout_s,
    )
    return _Uvicorn(config, on_started)


def guarded_protocol(
    server: uvicorn.Server, guard: ConnectionGuard
) -> Callable[[], asyncio.Protocol]:
    """A protocol factory for connections the front accepted, served by ``server``."""
    config = server.config
    state = server.server_state

    def protocol() -> asyncio.Protocol:
        return GuardedH11Protocol(config=config, server_state=state, app_state={}, guard=guard)

    return protocol

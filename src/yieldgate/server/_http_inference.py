"""One inference route of the HTTP app: read the body, parse it, admit, answer.

An ``Inference`` speaks one dialect (``_http_dialects``) over the shared
``Admission``. With a secret, it first checks the bearer token (401). It
reads the body (at most ``max_body_bytes``, else 413; a body that does not
arrive within ``body_timeout_s`` of its head is a 408: the connection guard
times it and marks the scope, see ``_http_guard``) and the priority and
deadline headers, refuses an optional param the backend's ``features`` do
not name (a 400 naming it: ``logprobs``, ``top_p``), charges the provider
quota when one is emulated (``_http_quota``: a 429 before any slot; the
charge is settled once the answer ends, whatever ended it, with the tokens
generated), and asks for admission: a yield is a 429 (Anthropic's route:
529) with ``retry-after-ms`` and ``retry-after`` (or the dialect's
cold-start 503), a failure the dialect's
error with its status, and an admitted request runs through the front
(``Front.run_admitted``, which cancels it if the client leaves), answered
whole or streamed as server-sent events that hold the slot until the last.
Every request it answers is counted by route and status. A backend that cut
a request's output (the harness's graceful degradation: ``"degraded"`` in
its result, or in a stream's first chunk) has the response say so in an
``x-yieldgate-degraded`` header (``max_tokens=8; requested=64; level=0``),
which clients that do not know it ignore.

A saturated server answers most requests with a yield, so that path is
plain ASGI: no starlette ``Request``, no cancel scope per body read (the
guard's deadline instead), and the 429's body and headers encoded once for
each ``Yield`` the Governor hands out (it hands back the same one while its
fields do not change).
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from starlette.types import Message, Receive, Scope, Send

from yieldgate._headers import (
    CACHE_CONTROL_HEADER,
    CONNECTION_HEADER,
    CONTENT_LENGTH_HEADER,
    CONTENT_TYPE_HEADER,
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_MS_HEADER,
    X_ACCEL_BUFFERING_HEADER,
)
from yieldgate.protocol import MAX_DEADLINE_MS, ErrorCode, Priority, parse_priority
from yieldgate.server._http_dialects import (
    BadRequest,
    Dialect,
    Generated,
    Job,
    chunk_is_last,
    chunk_text,
    chunk_token_ids,
    dumps,
    generated,
    loads,
    retry_after_s,
)
from yieldgate.server._http_guard import BODY_TIMED_OUT
from yieldgate.server._http_logprobs import read_logprobs
from yieldgate.server._http_quota import charge_quota
from yieldgate.server._http_responses import JSON, NO_RETRY, RETRY, send_json
from yieldgate.server.admission import Admitted, Failure
from yieldgate.server.backends import FEATURES, Backend, features_of
from yieldgate.server.governor import Slot, Yield

if TYPE_CHECKING:
    from yieldgate.server._http_front import Front
    from yieldgate.server._http_middleware import Secret

__all__ = ["Inference"]

log = logging.getLogger("yieldgate.server")

_INTEGER = re.compile(r"-?[0-9]{1,20}")
# A body past the limit is still read (and dropped) up to this many times the
# limit, so that the client, still sending, gets to read the 413.
_DRAIN_FACTOR = 16
_SSE_HEADERS = [
    (CONTENT_TYPE_HEADER.encode(), b"text/event-stream; charset=utf-8"),
    (CACHE_CONTROL_HEADER.encode(), b"no-cache"),
    (X_ACCEL_BUFFERING_HEADER.encode(), b"no"),
]
_CLOSE = (CONNECTION_HEADER.encode(), b"close")
_DEGRADED_HEADER = b"x-yieldgate-degraded"


def _degraded_headers(data: Any) -> list[tuple[bytes, bytes]]:
    """The ``x-yieldgate-degraded`` header for a result or chunk that says it was cut."""
    degraded = data.get("degraded") if isinstance(data, Mapping) else None
    if not isinstance(degraded, Mapping):
        return []
    fields = [("max_tokens", "max_tokens"), ("requested", "requested_max_tokens")]
    fields.append(("level", "level"))
    parts = [f"{name}={degraded[key]}" for name, key in fields if type(degraded.get(key)) is int]
    return [(_DEGRADED_HEADER, "; ".join(parts).encode("ascii"))] if parts else []


_RETRY_AFTER_MS = RETRY_AFTER_MS_HEADER.encode()
_RETRY_AFTER = RETRY_AFTER_HEADER.encode()
_CONTENT_LENGTH = CONTENT_LENGTH_HEADER.encode()
_PRIORITY = PRIORITY_HEADER.lower().encode()
_DEADLINE = DEADLINE_HEADER.lower().encode()


class _TooLarge(Exception):
    pass


class _TimedOut(Exception):
    pass


def _headers(scope: Scope) -> tuple[bytes | None, bytes | None, bytes | None]:
    """The request's content-length, priority and deadline headers (the first of each)."""
    length = priority = deadline = None
    for name, value in scope["headers"]:
        if name == _CONTENT_LENGTH:
            length = value if length is None else length
        elif name == _PRIORITY:
            priority = value if priority is None else priority
        elif name == _DEADLINE:
            deadline = value if deadline is None else deadline
    return length, priority, deadline


def _priority(raw: bytes | None) -> Priority:
    if raw is None:
        return Priority.NORMAL
    priority = parse_priority(raw.decode("latin-1"))  # any case: a header is not a frame
    if priority is None:
        raise BadRequest(f"header {PRIORITY_HEADER} must be high, normal or low")
    return priority


def _deadline_ms(raw: bytes | None) -> int | None:
    if raw is None:
        return None
    value = raw.decode("latin-1").strip()
    if not _INTEGER.fullmatch(value) or abs(int(value)) > MAX_DEADLINE_MS:
        raise BadRequest(f"header {DEADLINE_HEADER} must be an integer number of milliseconds")
    return int(value)


async def _read_body(
    scope: Scope, receive: Receive, length: bytes | None, limit: int
) -> bytes | None:
    """The whole body; ``None`` if the client left; ``_TooLarge`` once past
    ``limit``; ``_TimedOut`` once the guard marked the scope.

    The rest of a body that is too large is still read and dropped (up to
    ``_DRAIN_FACTOR`` times the limit), so that a client still sending it
    gets to read the 413 instead of a reset connection.
    """
    if length is not None and length.isdigit() and int(length) > limit * _DRAIN_FACTOR:
        raise _TooLarge
    chunks = []
    total = 0
    while True:
        message = await receive()
        kind = message["type"]
        if kind == "http.request":
            chunk = message.get("body", b"")
            total += len(chunk)
            if total <= limit:
                chunks.append(chunk)
            elif total > limit * _DRAIN_FACTOR:
                break
            if not message.get("more_body", False):
                break
            if scope.get(BODY_TIMED_OUT):
                raise _TimedOut
        elif kind == "http.disconnect":
            return None
    if total > limit:
        raise _TooLarge
    return b"".join(chunks)


def _refuse_unhonoured(job: Job, backend: Backend) -> None:
    """A 400 naming the first optional param the job asks for and the backend does not honour
    (log-probabilities a dialect only takes where honoured are asked for here, or not)."""
    features = features_of(backend)
    if job.logprobs_where_honoured and "logprobs" in features:
        job.params.setdefault("logprobs", 0)
    for key in sorted(FEATURES - features):
        if job.params.get(key) is not None:
            raise BadRequest(f"'{key}' is not supported by this server's backend", key)


def _num_tokens(text: str) -> int:
    """Tokens of ``text`` for the byte-level tokenizer: its UTF-8 bytes."""
    return len(text.encode("utf-8", "surrogatepass"))


def _generated(job: Job, result: Any) -> Generated:
    """The backend's result read, with its per-token log-probabilities where it sent them."""
    done = generated(job, result)
    logprobs = read_logprobs(result)
    return done if logprobs is None else dataclasses.replace(done, logprobs=logprobs)


class Inference:
    """One inference route: it speaks ``dialect`` over the shared Admission.

    ``route`` is what its requests are counted as (``Front.requests``);
    with a ``secret``, a request without it is answered 401.
    """

    def __init__(
        self,
        front: Front,
        dialect: Dialect,
        ids: Iterator[int],
        *,
        route: str,
        secret: Secret | None = None,
    ) -> None:
        self.front = front
        self.dialect = dialect
        self.route = route
        self._ids = ids
        self._secret = secret
        # The last yield answered, and its reply encoded.
        self._yield_of: Yield | None = None
        self._yield_headers: list[tuple[bytes, bytes]] = []
        self._yield_body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = "499"  # nginx's "client closed request": no response was started

        async def tracked(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            if self._secret is not None and not self._secret.admits(scope):
                body, headers = self._secret.refusal(scope["path"], self.dialect.family)
                await send_json(tracked, 401, body, headers)
                return
            await self._handle(scope, receive, tracked)
        except Exception:
            # Everything expected is answered in _handle; this is a bug, not a crash.
            log.exception("handling %s %s failed", scope["method"], scope["path"])
            if status == "499":
                await self._fail(tracked, 500, ErrorCode.BACKEND_ERROR, "internal error", False)
        finally:
            self.front.requests[(self.route, status)] += 1

    async def _handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        front, dialect = self.front, self.dialect
        length, priority_header, deadline_header = _headers(scope)
        limit = front.config.max_body_bytes
        try:
            raw = await _read_body(scope, receive, length, limit)
        except _TooLarge:
            message = f"request body exceeds max_body_bytes={limit}"
            await self._fail(send, 413, ErrorCode.FRAME_TOO_LARGE, message, False, close=True)
            return
        except _TimedOut:
            # A body that stalls must not hold the connection (and its descriptor)
            # for ever; nothing was admitted, so sending it again may succeed.
            front.body_timeouts += 1
            message = f"request body did not arrive within {front.config.body_timeout_s:g} s"
            await self._fail(send, 408, ErrorCode.BAD_FRAME, message, True, close=True)
            return
        if raw is None:
            return  # the client left
        try:
            priority = _priority(priority_header)
            deadline_ms = _deadline_ms(deadline_header)
            path_params = scope.get("path_params")
            model_id = None if path_params is None else path_params.get("model_id")
            job = dialect.parse(loads(raw), model_id, front.config.model_name)
            _refuse_unhonoured(job, front.backend)
        except BadRequest as exc:
            await self._fail(
                send,
                dialect.invalid_status,
                ErrorCode.BAD_FRAME,
                exc.message,
                False,
                param=exc.param,
            )
            return
        charged = await charge_quota(front, dialect, job, send)
        if charged is None:
            return  # over the provider's quota: answered 429, no slot taken
        try:
            await self._admit(receive, charged.send, job, priority, deadline_ms)
        finally:
            charged.settle(job.output_tokens)

    async def _admit(
        self, receive: Receive, send: Send, job: Job, priority: Priority, deadline_ms: int | None
    ) -> None:
        decision = self.front.admission.admit(
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
        param: str | None = None,
    ) -> None:
        self.front.governor.record_error(code)
        headers = [RETRY if retryable else NO_RETRY]
        if close:
            headers.append(_CLOSE)
        body = self.dialect.error(status, code, message, param)
        await send_json(send, status, dumps(body), headers)

    async def _yield(self, send: Send, job: Job, refusal: Yield) -> None:
        cold = self.dialect.cold_start(job, refusal)
        if cold is not None:
            await send_json(send, 503, dumps(cold))
            return
        if refusal is not self._yield_of:
            self._yield_body = dumps(
                {
                    **self.dialect.yield_fields(refusal),
                    "status": "yield",
                    "retry_hint_ms": refusal.retry_hint_ms,
                    "inflight": refusal.inflight,
                    "max_inflight": refusal.max_inflight,
                    "reason": str(refusal.reason),
                }
            )
            self._yield_headers = [
                JSON,
                (_CONTENT_LENGTH, str(len(self._yield_body)).encode()),
                (_RETRY_AFTER_MS, str(refusal.retry_hint_ms).encode()),
                (_RETRY_AFTER, str(retry_after_s(refusal.retry_hint_ms)).encode()),
                RETRY,
            ]
            self._yield_of = refusal
        status = self.dialect.yield_status
        await send(
            {"type": "http.response.start", "status": status, "headers": self._yield_headers}
        )
        await send({"type": "http.response.body", "body": self._yield_body, "more_body": False})

    # -- admitted work ----------------------------------------------------------

    async def _unary(self, receive: Receive, send: Send, job: Job, admitted: Admitted) -> None:
        dialect = self.dialect

        headers: list[tuple[bytes, bytes]] = []

        async def finish(result: Any, slot: Slot) -> bytes:
            headers.extend(_degraded_headers(result))
            done = _generated(job, result)
            job.output_tokens = done.usage["completion_tokens"]
            return dumps(dialect.ok(job, done))

        outcome = await self.front.run_admitted(admitted, receive, None, finish)
        if outcome is None:
            return  # the client left; its work was cancelled
        if isinstance(outcome, Failure):
            await self._failure(send, outcome)
        else:
            await send_json(send, 200, outcome, headers)

    async def _stream(self, receive: Receive, send: Send, job: Job, admitted: Admitted) -> None:
        dialect = self.dialect
        index = 0
        started = False

        async def start(data: Any = None) -> None:
            nonlocal started
            if not started:
                started = True
                headers = _SSE_HEADERS + _degraded_headers(data)
                await send({"type": "http.response.start", "status": 200, "headers": headers})

        held: Any = None  # a chunk marked last, for a dialect that ends with it

        async def send_piece(data: Any) -> None:
            nonlocal index
            event = dialect.piece_of(job, index, data)
            index += 1
            ids = chunk_token_ids(data)
            job.output_tokens += len(ids) if ids is not None else _num_tokens(chunk_text(data))
            await start(data)
            await send({"type": "http.response.body", "body": event, "more_body": True})

        async def emit(data: Any) -> None:
            nonlocal held
            if held is not None:  # a chunk after one marked last: the mark was wrong
                await send_piece(held)
                held = None
            if dialect.last_piece_ends and chunk_is_last(data):
                held = data
            else:
                await send_piece(data)

        async def finish(result: Any, slot: Slot) -> str:
            done = _generated(job, result)
            job.output_tokens = done.usage["completion_tokens"]
            if held is None:
                events = dialect.end(job, index, done)
            else:
                text, token_ids = chunk_text(held), chunk_token_ids(held)
                events = dialect.end_with(job, index, text, token_ids, done)
            await start(held)
            await send({"type": "http.response.body", "body": events, "more_body": False})
            return done.text

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

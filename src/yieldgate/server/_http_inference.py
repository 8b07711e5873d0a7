"""One inference route of the HTTP app: read the body, parse it, admit, answer.

An ``Inference`` app speaks one dialect (``_http_dialects``) over the
shared ``Admission``. It reads the body (at most ``max_body_bytes``, within
``body_timeout_s``, else 413 or 408) and the priority and deadline headers,
and asks for admission: a yield is a 429 with ``retry-after-ms`` and
``retry-after`` (or the dialect's cold-start 503), a failure the dialect's
error with its status, and an admitted request runs through the front
(``Front.run_admitted``, which cancels it if the client leaves), answered
whole or streamed as server-sent events that hold the slot until the last.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import anyio
from starlette.requests import ClientDisconnect, Request
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
    Job,
    chunk_is_last,
    chunk_text,
    chunk_token_ids,
    dumps,
    generated,
    loads,
    retry_after_s,
)
from yieldgate.server._http_responses import NO_RETRY, RETRY, send_json
from yieldgate.server.admission import Admitted, Failure
from yieldgate.server.governor import Slot, Yield

if TYPE_CHECKING:
    from yieldgate.server._http_app import Front

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
_RETRY_AFTER_MS = RETRY_AFTER_MS_HEADER.encode()
_RETRY_AFTER = RETRY_AFTER_HEADER.encode()


class _TooLarge(Exception):
    pass


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


class Inference:
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
            await self._fail(
                send,
                dialect.invalid_status,
                ErrorCode.BAD_FRAME,
                exc.message,
                False,
                param=exc.param,
            )
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
            RETRY,
        ]
        await send_json(send, 429, dumps(body), headers)

    # -- admitted work ----------------------------------------------------------

    async def _unary(self, receive: Receive, send: Send, job: Job, admitted: Admitted) -> None:
        dialect = self.dialect

        async def finish(result: Any, slot: Slot) -> bytes:
            return dumps(dialect.ok(job, generated(job, result)))

        outcome = await self.front.run_admitted(admitted, receive, None, finish)
        if outcome is None:
            return  # the client left; its work was cancelled
        if isinstance(outcome, Failure):
            await self._failure(send, outcome)
        else:
            await send_json(send, 200, outcome)

    async def _stream(self, receive: Receive, send: Send, job: Job, admitted: Admitted) -> None:
        dialect = self.dialect
        index = 0
        started = False

        async def start() -> None:
            nonlocal started
            if not started:
                started = True
                await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})

        held: tuple[str, tuple[int, ...] | None] | None = None

        async def send_piece(text: str, token_ids: tuple[int, ...] | None) -> None:
            nonlocal index
            event = dialect.piece(job, index, text, token_ids)
            index += 1
            await start()
            await send({"type": "http.response.body", "body": event, "more_body": True})

        async def emit(data: Any) -> None:
            nonlocal held
            text, token_ids = chunk_text(data), chunk_token_ids(data)
            if held is not None:  # a chunk after one marked last: the mark was wrong
                await send_piece(*held)
                held = None
            if dialect.last_piece_ends and chunk_is_last(data):
                held = (text, token_ids)
            else:
                await send_piece(text, token_ids)

        async def finish(result: Any, slot: Slot) -> str:
            done = generated(job, result)
            if held is None:
                events = dialect.end(job, index, done)
            else:
                events = dialect.end_with(job, index, *held, done)
            await start()
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

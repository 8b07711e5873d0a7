"""The Gate under an HTTP client: a transport for httpx and for httpx2.

The official ``openai`` (3.x) and ``huggingface_hub`` (2.x) clients are built
on httpx2, a package separate from httpx with its own transport base class;
plain httpx code uses httpx. One implementation serves both: ``_GatedCore``
holds the logic, and a thin subclass of each library's ``AsyncBaseTransport``
(built on first use, so neither library is imported before it is needed)
hands requests to it.

Each request becomes one Gate call. An attempt sends the request through the
inner transport and the dialect classifies the response (error bodies are
read for that; 2xx bodies are not, they may be streams). Retries, waits on
hints, the window, the breaker and the budget are the Gate's. A 2xx response
keeps its window slot until its body is closed, so a stream read for a
minute occupies the window for that minute.

When the Gate gives up after an attempt that got a response (a 429 it stopped
waiting on, a 400 that is fatal), that response is returned as is, so the
client raises its own status error as it always did (``openai.RateLimitError``
and so on); the Gate's reason is in ``response.extensions["yieldgate_error"]``.
When no response came (circuit open, connection refused, deadline passed),
the ``YieldgateError`` is raised from the transport; the openai client wraps
it in ``APIConnectionError`` with the Gate's error as ``__cause__``.

Per request, the header ``x-yieldgate-priority: high|normal|low`` sets the
call's priority (it is also sent, for servers that read it, as yieldgate's
reference server does). Use the client's own retries off (``max_retries=0``
for openai): retrying is the Gate's job.

The body of a non-2xx response is read for the dialect, but at most
``MAX_ERROR_BODY_BYTES`` (1 MiB, what a dialect parses) of it: the rest is
never downloaded, the connection is closed, and the response handed on (to
the client, when the Gate gives up) carries the bytes read, with
``extensions["yieldgate_truncated"]`` set when there were more.

An attempt ends at the first chunk of a 2xx body, not at its headers: a
server that sends headers and then fails is retried, and a hedge delay
measures the time to the first token of a stream. After the first chunk, a
failed read raises ``StreamInterruptedError`` with the bytes received (for
event streams and NDJSON), never a silent restart.

A Gate built with ``upstreams={"a": "http://host-a:8000", ...}`` sends each
attempt to the chosen upstream's origin (scheme, host and port; the path
stays the client's), so one client can race or fail over between replicas.
"""

from __future__ import annotations

import functools
import importlib
import uuid
import weakref
from collections.abc import AsyncIterator
from typing import Any, Literal
from urllib.parse import urlsplit

import anyio

from yieldgate._exceptions import CallFailedError, StreamInterruptedError, YieldgateError
from yieldgate.dialects import HttpDialect, get_dialect
from yieldgate.gate import (
    USE_POLICY,
    AttemptInfo,
    Gate,
    Lease,
    Outcome,
    Signal,
    UsePolicy,
    current_attempt,
)
from yieldgate.protocol import DEADLINE_HEADER, PRIORITY_HEADER, Priority, parse_priority

__all__ = [
    "DEADLINE_HEADER",
    "MAX_ERROR_BODY_BYTES",
    "PRIORITY_HEADER",
    "Flavor",
    "gate_transport",
    "http_client",
]

Flavor = Literal["httpx", "httpx2"]
MAX_ERROR_BODY_BYTES = 1 << 20
# Headers that describe the body as it was sent, not the (decoded, maybe cut) bytes kept.
_BODY_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def _library(flavor: str) -> Any:
    if flavor not in ("httpx", "httpx2"):
        raise ValueError(f"flavor must be 'httpx' or 'httpx2', got {flavor!r}")
    try:
        return importlib.import_module(flavor)
    except ImportError:
        hint = "pip install 'yieldgate[httpx2]'" if flavor == "httpx2" else "pip install httpx"
        raise ImportError(f"flavor={flavor!r} needs the {flavor} package: {hint}") from None


class _GatedCore:
    """What a gated transport does, whichever library's types it handles."""

    def __init__(
        self,
        gate: Gate,
        dialect: HttpDialect,
        inner: Any,
        lib: Any,
        stream_class: type,
        call_timeout: float | UsePolicy | None,
    ) -> None:
        self.gate = gate
        self.dialect = dialect
        self.inner = inner
        self._lib = lib
        self._stream_class = stream_class
        self._call_timeout = call_timeout

    async def handle(self, request: Any) -> Any:
        # Attempts after the first resend the body: load it once, so that a
        # streamed upload becomes bytes that can be sent again.
        await request.aread()
        priority = _priority(request.headers.get(PRIORITY_HEADER))
        if PRIORITY_HEADER in request.headers:
            # Forwarded as the server reads it, whatever case the caller wrote.
            request.headers[PRIORITY_HEADER] = priority.value
        key_header = self.dialect.idempotency_header
        if key_header is not None and key_header not in request.headers:
            request.headers[key_header] = uuid.uuid4().hex
        try:
            response, lease = await self.gate.call_and_hold(
                self._attempt,
                request,
                priority=priority,
                timeout=self._call_timeout,
                classify=self.dialect,
                discard=_close_response,
            )
        except YieldgateError as exc:
            last = exc.last_outcome
            if isinstance(last, Outcome) and _is_response(last.value):
                # The client sees the upstream's answer and raises its own error.
                last.value.extensions["yieldgate_error"] = exc
                return last.value
            cause = exc.__cause__
            if isinstance(exc, CallFailedError) and isinstance(cause, Exception):
                # Not the upstream's doing (a bad URL, say): the library's own
                # error, as the client would have raised it without a Gate.
                raise cause from None
            raise
        if getattr(response, "is_closed", False):
            # Already read and closed by the inner transport (a mock's
            # ``Response(content=...)`` is): nothing will close it again.
            lease.release()
        else:
            response.stream = self._stream_class(
                response.stream, lease, _keeps_chunks(response.headers)
            )
        return response

    async def _attempt(self, request: Any) -> Any:
        attempt = current_attempt()
        if attempt is not None and (attempt.hedging or attempt.upstream is not None):
            # Attempts that may run at once, or go elsewhere, each get a copy.
            request = self._copy_for(request, attempt)
        if self.dialect.propagate_deadline:
            remaining = None if attempt is None else attempt.remaining_s()
            if remaining is not None:
                request.headers[DEADLINE_HEADER] = str(max(1, int(remaining * 1000)))
        response = await self.inner.handle_async_request(request)
        if not 200 <= response.status_code < 300:
            # The dialect reads error bodies, and a retry drops this response,
            # so its connection must be freed now.
            return await self._bounded(response, request)
        if not getattr(response, "is_closed", False):
            await _first_chunk(response)
        return response

    async def _bounded(self, response: Any, request: Any) -> Any:
        """``response`` with its body read, but never more than ``MAX_ERROR_BODY_BYTES``.

        A 429 with a 100 MiB body must not be downloaded on every attempt: the
        reading stops past the cap, the connection is closed (the rest is never
        read), and a copy of the response carries what was read.
        """
        body = bytearray()
        truncated = False
        try:
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_ERROR_BODY_BYTES:
                    truncated = True
                    del body[MAX_ERROR_BODY_BYTES:]
                    break
        finally:
            # Even when the attempt is being cancelled: else the connection
            # stays checked out of the pool.
            with anyio.CancelScope(shield=True):
                await response.aclose()
        headers = response.headers.copy()
        for name in _BODY_HEADERS:
            headers.pop(name, None)
        extensions = dict(response.extensions)
        if truncated:
            extensions["yieldgate_truncated"] = True
        return self._lib.Response(
            response.status_code,
            headers=headers,
            content=bytes(body),
            request=request,
            extensions=extensions,
        )

    def _copy_for(self, request: Any, attempt: AttemptInfo) -> Any:
        url = request.url
        # An upstream named by its URL needs no separate target.
        target = attempt.target if attempt.target is not None else attempt.upstream
        if isinstance(target, str):
            origin = urlsplit(target)
            if not origin.scheme or not origin.hostname:
                raise ValueError(
                    f"upstream {attempt.upstream!r}: target {target!r} is not an http(s) URL"
                )
            url = url.copy_with(scheme=origin.scheme, host=origin.hostname, port=origin.port)
        elif target is not None:
            raise ValueError(
                f"upstream {attempt.upstream!r}: an HTTP transport needs a URL as the "
                f"target, got {type(target).__name__}"
            )
        headers = request.headers.copy()
        if isinstance(target, str):
            headers["host"] = url.netloc.decode("ascii")
        return self._lib.Request(
            request.method,
            url,
            headers=headers,
            content=request.content,
            extensions=dict(request.extensions),
        )

    async def aclose(self) -> None:
        await self.inner.aclose()


def _priority(value: str | None) -> Priority:
    if value is None:
        return Priority.NORMAL
    found = parse_priority(value)
    if found is None:
        raise ValueError(f"{PRIORITY_HEADER} must be high, normal or low, got {value!r}")
    return found


def _is_response(value: Any) -> bool:
    return hasattr(value, "status_code") and hasattr(value, "extensions")


async def _close_response(response: Any) -> None:
    """Close the response of a hedge that won too late: it frees its connection."""
    await response.aclose()


class _Prefetched:
    """A body whose first chunk was read inside the attempt (see ``_first_chunk``)."""

    def __init__(self, first: bytes | None, rest: AsyncIterator[bytes], inner: Any) -> None:
        self.first = first
        self.rest = rest
        self.inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self.first is None:
            return
        first, self.first = self.first, None
        yield first
        async for chunk in self.rest:
            yield chunk

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


async def _first_chunk(response: Any) -> None:
    """Read the first non-empty chunk of a 2xx body while the attempt is running.

    A failure here is still the attempt's (retried, hedged); the chunk is
    kept and handed out first when the body is read.
    """
    stream = response.stream
    chunks = stream.__aiter__()
    first: bytes | None = None
    try:
        async for chunk in chunks:
            if chunk:
                first = chunk
                break
    except BaseException:
        with anyio.CancelScope(shield=True):
            await response.aclose()
        raise
    response.stream = _Prefetched(first, chunks, stream)


def _keeps_chunks(response_headers: Any) -> bool:
    kind = str(response_headers.get("content-type", "")).lower()
    return kind.startswith("text/event-stream") or "ndjson" in kind or "jsonl" in kind


def _release_quietly(lease: Lease) -> None:
    # Called by the garbage collector for a body nobody closed: never raise there.
    try:
        lease.release(Signal.CANCELLED)
    except Exception:  # pragma: no cover - a window in a torn-down loop
        return


class _LeasedStreamMixin:
    """A response body that gives its window slot back when it is closed.

    Read to the end or closed early, the upstream did its work: success. A
    read that fails tells the window the attempt failed; a cancelled read,
    that it was cancelled. A body dropped without being closed returns the
    slot when it is garbage collected.
    """

    def __init__(self, inner: Any, lease: Lease, keep: bool = False) -> None:
        self._inner = inner
        self._lease = lease
        self._outcome = Signal.SUCCESS
        self._keep = keep
        self._finalizer = weakref.finalize(self, _release_quietly, lease)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        received: list[bytes] = []
        delivered = 0
        try:
            async for chunk in self._inner:
                if self._keep:
                    received.append(chunk)
                delivered += 1
                yield chunk
        except anyio.get_cancelled_exc_class():
            self._outcome = Signal.CANCELLED
            raise
        except Exception as exc:
            self._outcome = Signal.FAILURE
            if delivered and not isinstance(exc, StreamInterruptedError):
                # Past the commit point: the caller has output a retry would repeat.
                raise StreamInterruptedError(
                    f"response body failed after {delivered} chunk(s), which were "
                    f"delivered and are not repeated: {exc!r}",
                    chunks=received,
                ) from exc
            raise

    async def aclose(self) -> None:
        try:
            close = getattr(self._inner, "aclose", None)
            if close is not None:
                await close()
        finally:
            self._finalizer.detach()
            self._lease.release(self._outcome)


@functools.cache
def _classes(flavor: str) -> tuple[type, type]:
    """The transport and body-stream classes for one library, built once."""
    lib = _library(flavor)

    class LeasedStream(_LeasedStreamMixin, lib.AsyncByteStream):  # type: ignore[misc, name-defined]
        pass

    class GateTransport(lib.AsyncBaseTransport):  # type: ignore[misc, name-defined]
        """A transport that sends every request through a Gate."""

        def __init__(
            self,
            gate: Gate,
            *,
            dialect: str | HttpDialect = "openai",
            inner: Any = None,
            call_timeout: float | UsePolicy | None = USE_POLICY,
        ) -> None:
            self._core = _GatedCore(
                gate,
                get_dialect(dialect),
                inner if inner is not None else lib.AsyncHTTPTransport(),
                lib,
                LeasedStream,
                call_timeout,
            )

        @property
        def gate(self) -> Gate:
            return self._core.gate

        @property
        def dialect(self) -> HttpDialect:
            return self._core.dialect

        async def handle_async_request(self, request: Any) -> Any:
            return await self._core.handle(request)

        async def aclose(self) -> None:
            await self._core.aclose()

    GateTransport.__qualname__ = GateTransport.__name__ = f"GateTransport[{flavor}]"
    return GateTransport, LeasedStream


def gate_transport(
    gate: Gate,
    *,
    dialect: str | HttpDialect = "openai",
    flavor: Flavor = "httpx2",
    inner: Any = None,
    call_timeout: float | UsePolicy | None = USE_POLICY,
) -> Any:
    """An ``AsyncBaseTransport`` of ``flavor``'s library that sends through ``gate``.

    ``inner`` is the transport that does the sending (default: the library's
    ``AsyncHTTPTransport()``); ``dialect`` says what responses mean (a name or
    an ``HttpDialect``); ``call_timeout`` overrides the Gate policy's total
    time per request, retries and waits included (``None``: no limit).
    """
    transport_class, _ = _classes(flavor)
    return transport_class(gate, dialect=dialect, inner=inner, call_timeout=call_timeout)


def http_client(
    gate: Gate,
    *,
    dialect: str | HttpDialect = "openai",
    flavor: Flavor = "httpx2",
    inner: Any = None,
    call_timeout: float | UsePolicy | None = USE_POLICY,
    **client_kwargs: Any,
) -> Any:
    """A ready ``AsyncClient`` of ``flavor``'s library whose requests go through ``gate``.

    ``flavor="httpx2"`` (the default) for the official openai 3.x and
    huggingface_hub 2.x clients; ``"httpx"`` for code using httpx itself.
    ``client_kwargs`` go to the ``AsyncClient`` (``base_url``, ``headers``,
    ``timeout`` for each request's own network timeouts, ...)::

        client = openai.AsyncOpenAI(
            base_url=url, http_client=yieldgate.http_client(gate), max_retries=0
        )
    """
    lib = _library(flavor)
    transport = gate_transport(
        gate, dialect=dialect, flavor=flavor, inner=inner, call_timeout=call_timeout
    )
    return lib.AsyncClient(transport=transport, **client_kwargs)

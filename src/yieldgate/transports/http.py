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
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections.abc import AsyncIterator
from typing import Any, Literal

import anyio

from yieldgate._exceptions import CallFailedError, YieldgateError
from yieldgate.dialects import HttpDialect, get_dialect
from yieldgate.gate import USE_POLICY, Gate, Lease, Outcome, Signal, UsePolicy, current_attempt
from yieldgate.protocol import PRIORITY_BY_NAME, Priority

__all__ = ["DEADLINE_HEADER", "PRIORITY_HEADER", "Flavor", "gate_transport", "http_client"]

Flavor = Literal["httpx", "httpx2"]
PRIORITY_HEADER = "x-yieldgate-priority"
DEADLINE_HEADER = "x-yieldgate-deadline-ms"


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
        stream_class: type,
        call_timeout: float | UsePolicy | None,
    ) -> None:
        self.gate = gate
        self.dialect = dialect
        self.inner = inner
        self._stream_class = stream_class
        self._call_timeout = call_timeout

    async def handle(self, request: Any) -> Any:
        # Attempts after the first resend the body: load it once, so that a
        # streamed upload becomes bytes that can be sent again.
        await request.aread()
        priority = _priority(request.headers.get(PRIORITY_HEADER))
        try:
            response, lease = await self.gate.call_and_hold(
                self._attempt,
                request,
                priority=priority,
                timeout=self._call_timeout,
                classify=self.dialect,
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
            response.stream = self._stream_class(response.stream, lease)
        return response

    async def _attempt(self, request: Any) -> Any:
        if self.dialect.propagate_deadline:
            attempt = current_attempt()
            remaining = None if attempt is None else attempt.remaining_s()
            if remaining is not None:
                request.headers[DEADLINE_HEADER] = str(max(1, int(remaining * 1000)))
        response = await self.inner.handle_async_request(request)
        if not 200 <= response.status_code < 300:
            # The dialect reads error bodies; they are small, and a retry
            # drops this response, so its connection must be freed now.
            try:
                await response.aread()
            finally:
                # Even when the attempt is being cancelled: else the
                # connection stays checked out of the pool.
                with anyio.CancelScope(shield=True):
                    await response.aclose()
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def _priority(value: str | None) -> Priority:
    if value is None:
        return Priority.NORMAL
    found = PRIORITY_BY_NAME.get(value.strip().lower())
    if found is None:
        raise ValueError(f"{PRIORITY_HEADER} must be high, normal or low, got {value!r}")
    return found


def _is_response(value: Any) -> bool:
    return hasattr(value, "status_code") and hasattr(value, "extensions")


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

    def __init__(self, inner: Any, lease: Lease) -> None:
        self._inner = inner
        self._lease = lease
        self._outcome = Signal.SUCCESS
        self._finalizer = weakref.finalize(self, _release_quietly, lease)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except anyio.get_cancelled_exc_class():
            self._outcome = Signal.CANCELLED
            raise
        except Exception:
            self._outcome = Signal.FAILURE
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

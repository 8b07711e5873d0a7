"""The async gated transport: an ``AsyncBaseTransport`` of httpx or httpx2.

Each request is one ``await gate.call_and_hold(...)``; ``_http_core`` decides
what each step means, this module awaits.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from typing import Any

import anyio

from yieldgate._exceptions import YieldgateError
from yieldgate.dialects import HttpDialect, get_dialect
from yieldgate.gate import USE_POLICY, Gate, Signal, UsePolicy
from yieldgate.transports._flavor import library
from yieldgate.transports._http_core import (
    ErrorBody,
    GatedCore,
    LeasedBody,
    Prefetched,
    given_up,
    is_closed,
    is_success,
)
from yieldgate.transports._per_loop import PerLoopTransport

__all__ = ["async_transport_class"]


class _AsyncGated(GatedCore):
    async def handle(self, request: Any) -> Any:
        # Attempts after the first resend the body: load it once, so that a
        # streamed upload becomes bytes that can be sent again.
        await request.aread()
        priority = self.start(request)
        lease = None
        try:
            try:
                response, lease = await self.gate.call_and_hold(
                    self._attempt,
                    request,
                    priority=priority,
                    timeout=self.call_timeout(request),
                    classify=self.dialect,
                    discard=_close_response,
                    cost=self.cost(request),
                )
            except YieldgateError as exc:
                return given_up(exc, request, self.lib)
            return self.settle(response, lease)
        except BaseException:
            if lease is not None:  # the client never got the response (an interrupt)
                lease.release(Signal.CANCELLED)
                with anyio.CancelScope(shield=True):
                    await response.aclose()
            raise

    async def _attempt(self, request: Any) -> Any:
        request, attempt = self.for_attempt(request)
        response = await self.inner.handle_async_request(request)
        if not is_success(response):
            # The dialect reads error bodies, and a retry drops this response,
            # so its connection must be freed now.
            return await self._bounded(response, request)
        if not is_closed(response):
            await self._first_chunk(response)
        self.note_model(response, attempt)
        return response

    async def _bounded(self, response: Any, request: Any) -> Any:
        body = ErrorBody()
        try:
            async for chunk in response.aiter_bytes():
                if body.add(chunk):
                    break
        finally:
            # Even when the attempt is being cancelled: else the connection
            # stays checked out of the pool.
            with anyio.CancelScope(shield=True):
                await response.aclose()
        return body.response(self.lib, response, request)

    async def _first_chunk(self, response: Any) -> None:
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
        response.stream = self.prefetched(first, chunks, stream)

    async def aclose(self) -> None:
        try:
            await self.inner.aclose()
        finally:
            # Streams still open keep no slot once their transport is gone.
            self.held.release_all()


async def _close_response(response: Any) -> None:
    """Close the response of a hedge that won too late: it frees its connection."""
    await response.aclose()


class _AsyncPrefetched(Prefetched):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        first = self.take_first()
        if first is None:
            return
        yield first
        async for chunk in self.rest:
            yield chunk

    async def aclose(self) -> None:
        close = getattr(self.inner, "aclose", None)
        if close is not None:
            await close()


class _AsyncLeased(LeasedBody):
    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunks = aiter(self._inner)
        try:
            while True:
                self._reading()
                try:
                    chunk = await anext(chunks)
                except StopAsyncIteration:
                    break
                self._passed(chunk)
                yield chunk
        except anyio.get_cancelled_exc_class():
            self._cancelled()
            raise
        except Exception as exc:
            interrupted = self._failed(exc)
            if interrupted is not None:
                raise interrupted from exc
            raise

    async def aclose(self) -> None:
        try:
            close = getattr(self._inner, "aclose", None)
            if close is not None:
                await close()
        finally:
            self._release()


@functools.cache
def async_transport_class(flavor: str) -> type:
    """The async transport class of one library, built on first use (and once)."""
    lib = library(flavor)

    class Leased(_AsyncLeased, lib.AsyncByteStream):  # type: ignore[misc, name-defined]
        pass

    class Prefetched(_AsyncPrefetched, lib.AsyncByteStream):  # type: ignore[misc, name-defined]
        pass

    class GateTransport(lib.AsyncBaseTransport):  # type: ignore[misc, name-defined]
        """An async transport that sends every request through a Gate."""

        def __init__(
            self,
            gate: Gate,
            *,
            dialect: str | HttpDialect = "openai",
            inner: Any = None,
            timeout: float | UsePolicy | None = USE_POLICY,
        ) -> None:
            # A pool of our own is one per event loop: a client made once keeps
            # working under a second ``asyncio.run``. An inner of yours is used as is.
            inner = inner if inner is not None else PerLoopTransport(lib.AsyncHTTPTransport)
            self._core = _AsyncGated(
                gate, get_dialect(dialect), inner, lib, Leased, Prefetched, timeout
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
    return GateTransport

"""The sync gated transport: a ``BaseTransport`` of httpx or httpx2.

Each request is one ``gate.call_and_hold_sync(...)`` in the calling thread;
``_http_core`` decides what each step means, exactly as for the async
transport. A thread blocked on a socket cannot be interrupted, so each
network wait of an attempt (connect, write, read, a pool slot) is bounded by
the time the attempt has left: a server that stalls becomes the library's
timeout error, a retryable outcome. An error body is read only while the
attempt has time left (a server may drip it a byte at a time): what was read
by the deadline is kept, marked truncated.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from yieldgate._exceptions import BlockingCallError, YieldgateError
from yieldgate.dialects import HttpDialect, get_dialect
from yieldgate.gate import USE_POLICY, AttemptInfo, Gate, Signal, UsePolicy
from yieldgate.gate._gate_sync import blocking_here
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

__all__ = ["sync_transport_class"]

# httpcore reads these from ``request.extensions["timeout"]``, each in seconds or None.
_TIMEOUT_KEYS = ("connect", "read", "write", "pool")
# A timeout of 0 would make the socket non-blocking, not "no time left".
_MIN_TIMEOUT_S = 0.001


def bounded_timeouts(timeouts: Any, remaining_s: float | None) -> Any:
    """The client's network timeouts, none longer than ``remaining_s``."""
    if remaining_s is None:
        return timeouts
    limit = max(remaining_s, _MIN_TIMEOUT_S)
    given = timeouts if isinstance(timeouts, dict) else {}
    bounded = dict(given)
    for key in _TIMEOUT_KEYS:
        value = given.get(key)
        bounded[key] = limit if value is None else min(float(value), limit)
    return bounded


def _cut_read_timeout(request: Any, attempt: AttemptInfo | None) -> bool:
    """Bound the read timeout of ``request``'s body to the attempt's time left.

    httpcore reads ``request.extensions["timeout"]`` when the body starts to be
    read (the request it sends shares the extensions). True when the attempt's
    time, not the client's own read timeout, is the bound now.
    """
    remaining = None if attempt is None else attempt.remaining_s()
    if remaining is None:
        return False
    timeouts = request.extensions.get("timeout")
    own = timeouts.get("read") if isinstance(timeouts, dict) else None
    limit = max(remaining, _MIN_TIMEOUT_S)
    if own is not None and float(own) <= limit:
        return False
    request.extensions["timeout"] = {**(timeouts or {}), "read": limit}
    return True


def _out_of_time(attempt: AttemptInfo | None) -> bool:
    remaining = None if attempt is None else attempt.remaining_s()
    return remaining is not None and remaining <= 0


class _SyncGated(GatedCore):
    # Requests from a thread that runs an event loop are refused unless this is set
    # (``Gate.call_sync``'s ``allow_event_loop``).
    allow_event_loop = False

    def handle(self, request: Any) -> Any:
        if not self.allow_event_loop and blocking_here():
            raise BlockingCallError(
                f"a sync client's request ({request.method} {request.url}) would block "
                "this thread's running event loop: use the async client and await it, or "
                "run the sync code in a worker thread (`await asyncio.to_thread(...)`)"
            )
        # Attempts after the first resend the body: load it once.
        request.read()
        priority = self.start(request)
        timeouts = request.extensions.get("timeout")
        lease = None
        try:
            try:
                response, lease = self.gate.call_and_hold_sync(
                    self._attempt,
                    request,
                    timeouts,
                    priority=priority,
                    timeout=self.call_timeout(request),
                    classify=self.dialect,
                    discard=_close_response,
                    cost=self.cost(request),
                    allow_event_loop=self.allow_event_loop,
                )
            except BlockingCallError:
                raise  # a mistake in the caller's code, not the upstream's: said as it is
            except YieldgateError as exc:
                return given_up(exc, request, self.lib)
            return self.settle(response, lease)
        except BaseException:
            if lease is not None:  # the client never got the response (an interrupt)
                lease.release(Signal.CANCELLED)
                response.close()
            raise

    def _attempt(self, request: Any, timeouts: Any) -> Any:
        request, attempt = self.for_attempt(request)
        if attempt is not None:
            bounded = bounded_timeouts(timeouts, attempt.remaining_s())
            if bounded is not None:
                request.extensions = {**request.extensions, "timeout": bounded}
        response = self.inner.handle_request(request)
        if not is_success(response):
            return self._bounded(response, request, attempt)
        if not is_closed(response):
            self._first_chunk(response)
        self.note_model(response, attempt)
        return response

    def _bounded(self, response: Any, request: Any, attempt: AttemptInfo | None) -> Any:
        """The error body, read until its end, the size cap or the attempt's deadline.

        Each read waits at most the time left, but a server that drips its body
        a byte at a time never lets one wait that long: the time is checked
        between chunks too. What was read by then is handed on, marked
        truncated, so the dialect still classifies by status and headers.
        """
        body = ErrorBody()
        cut = _cut_read_timeout(request, attempt)
        try:
            for chunk in response.iter_bytes():
                if body.add(chunk) or _out_of_time(attempt):
                    body.truncated = True
                    break
        except self.lib.ReadTimeout:
            if not cut:
                raise  # the client's own read timeout, shorter than the attempt's
            body.truncated = True
        finally:
            response.close()
        return body.response(self.lib, response, request)

    def _first_chunk(self, response: Any) -> None:
        stream = response.stream
        chunks = iter(stream)
        first: bytes | None = None
        try:
            for chunk in chunks:
                if chunk:
                    first = chunk
                    break
        except BaseException:
            response.close()
            raise
        response.stream = self.prefetched(first, chunks, stream)

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            # Streams still open keep no slot once their transport is gone.
            self.held.release_all()


def _close_response(response: Any) -> None:
    """Close the response of a hedge that won too late: it frees its connection."""
    response.close()


class _SyncPrefetched(Prefetched):
    def __iter__(self) -> Iterator[bytes]:
        first = self.take_first()
        if first is None:
            return
        yield first
        yield from self.rest

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class _SyncLeased(LeasedBody):
    def __iter__(self) -> Iterator[bytes]:
        chunks = iter(self._inner)
        try:
            while True:
                self._reading()
                try:
                    chunk = next(chunks)
                except StopIteration:
                    break
                self._passed(chunk)
                yield chunk
        except Exception as exc:
            interrupted = self._failed(exc)
            if interrupted is not None:
                raise interrupted from exc
            raise
        except (KeyboardInterrupt, SystemExit):
            self._cancelled()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            self._release()


@functools.cache
def sync_transport_class(flavor: str) -> type:
    """The sync transport class of one library, built on first use (and once)."""
    lib = library(flavor)

    class Leased(_SyncLeased, lib.SyncByteStream):  # type: ignore[misc, name-defined]
        pass

    class Prefetched(_SyncPrefetched, lib.SyncByteStream):  # type: ignore[misc, name-defined]
        pass

    class SyncGateTransport(lib.BaseTransport):  # type: ignore[misc, name-defined]
        """A sync transport that sends every request through a Gate."""

        def __init__(
            self,
            gate: Gate,
            *,
            dialect: str | HttpDialect = "openai",
            inner: Any = None,
            timeout: float | UsePolicy | None = USE_POLICY,
            allow_event_loop: bool = False,
        ) -> None:
            inner = inner if inner is not None else lib.HTTPTransport()
            self._core = _SyncGated(
                gate, get_dialect(dialect), inner, lib, Leased, Prefetched, timeout
            )
            self._core.allow_event_loop = allow_event_loop

        @property
        def gate(self) -> Gate:
            return self._core.gate

        @property
        def dialect(self) -> HttpDialect:
            return self._core.dialect

        def handle_request(self, request: Any) -> Any:
            return self._core.handle(request)

        def close(self) -> None:
            self._core.close()

    SyncGateTransport.__qualname__ = SyncGateTransport.__name__ = f"SyncGateTransport[{flavor}]"
    return SyncGateTransport

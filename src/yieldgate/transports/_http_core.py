"""What a gated HTTP transport decides, whichever library and whether sync or async.

No I/O here: the async and the sync transports (``_http_async``,
``_http_sync``) do the sending, reading and waiting, and ask this module what
every step means. Priority and idempotency headers, the copy of a request for
an upstream or a hedge, the deadline header, the bounded error body, what the
client gets when the Gate gives up, and the bookkeeping of a body that holds a
window slot are each written once, here.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any, NoReturn
from urllib.parse import urlsplit

from yieldgate._exceptions import (
    CallFailedError,
    DeadlineExceededError,
    StreamInterruptedError,
    YieldgateError,
)
from yieldgate._headers import (
    CONTENT_ENCODING_HEADER,
    CONTENT_LENGTH_HEADER,
    CONTENT_TYPE_HEADER,
    TRANSFER_ENCODING_HEADER,
)
from yieldgate.dialects import HttpDialect
from yieldgate.dialects._cost import estimate_cost, model_of, usage_of
from yieldgate.gate import (
    AttemptInfo,
    Cost,
    Gate,
    Lease,
    Outcome,
    Signal,
    UsePolicy,
    current_attempt,
)
from yieldgate.gate._dropped import in_collection
from yieldgate.protocol import DEADLINE_HEADER, PRIORITY_HEADER, Priority, parse_priority

__all__ = [
    "MAX_ERROR_BODY_BYTES",
    "ErrorBody",
    "GatedCore",
    "HeldBodies",
    "LeasedBody",
    "Prefetched",
    "given_up",
    "is_closed",
    "is_response",
    "is_success",
    "library_error",
]

MAX_ERROR_BODY_BYTES = 1 << 20
_USAGE_TAIL = 4096
# Headers that describe the body as it was sent, not the (decoded, maybe cut) bytes kept.
_BODY_HEADERS = (CONTENT_ENCODING_HEADER, CONTENT_LENGTH_HEADER, TRANSFER_ENCODING_HEADER)


class GatedCore:
    """The state and the decisions of one gated transport.

    ``lib`` is the httpx or httpx2 module; ``leased`` and ``prefetched``
    are the body classes (a ``LeasedBody`` or a ``Prefetched`` and the
    library's byte stream) that a 2xx response's body is wrapped in.
    """

    def __init__(
        self,
        gate: Gate,
        dialect: HttpDialect,
        inner: Any,
        lib: Any,
        leased: type[LeasedBody],
        prefetched: type[Prefetched],
        timeout: float | UsePolicy | None,
    ) -> None:
        self.gate = gate
        self.dialect = dialect
        self.inner = inner
        self.lib = lib
        self.leased = leased
        self.prefetched = prefetched
        self.timeout = timeout
        self.held = HeldBodies()

    def call_timeout(self, request: Any) -> float | UsePolicy | None:
        """The Gate's total time for ``request``: the transport's, cut to the request's own.

        A client that sets a timeout (``AsyncOpenAI(timeout=0.5)``) means the
        request, not each attempt: it bounds the whole call, waits and retries
        included. A request with an unbounded part (``None`` for reads, say)
        sets no bound of its own.
        """
        own = _request_timeout(request.extensions.get("timeout"))
        if own is None:
            return self.timeout
        total = (
            self.gate.policy.timeout.total_s
            if isinstance(self.timeout, UsePolicy)
            else (self.timeout)
        )
        return own if total is None else min(own, total)

    def cost(self, request: Any) -> Cost | None:
        """What ``request`` will cost of the upstream's quota (its body read), when
        the Gate paces by one; ``None``: one request, tokens unknown."""
        quota = self.gate.policy.quota
        if not quota.active or request.method != "POST":
            return None
        return estimate_cost(request.content, quota, path=request.url.path)

    def start(self, request: Any) -> Priority:
        """The call's priority, read from the request; its headers set for every attempt."""
        priority = _priority(request.headers.get(PRIORITY_HEADER))
        if PRIORITY_HEADER in request.headers:
            # Forwarded as the server reads it, whatever case the caller wrote.
            request.headers[PRIORITY_HEADER] = priority.value
        key_header = self.dialect.idempotency_header
        if key_header is not None and key_header not in request.headers:
            request.headers[key_header] = uuid.uuid4().hex
        return priority

    def for_attempt(self, request: Any) -> tuple[Any, AttemptInfo | None]:
        """The request one attempt sends, and the attempt it is sent for."""
        attempt = current_attempt()
        if attempt is not None and (attempt.hedging or attempt.upstream is not None):
            # Attempts that may run at once, or go elsewhere, each get a copy.
            request = self._copy_for(request, attempt)
        if self.dialect.propagate_deadline:
            remaining = None if attempt is None else attempt.remaining_s()
            if remaining is not None:
                request.headers[DEADLINE_HEADER] = str(max(1, int(remaining * 1000)))
        return request, attempt

    def note_model(self, response: Any, attempt: AttemptInfo | None) -> None:
        """Tell the Gate the model a 2xx answer names (its first chunk read, or its
        whole body), so that a snapshot of the model requested shares its quota."""
        if attempt is None or not self.gate.policy.quota.per_model:
            return
        stream = response.stream
        if isinstance(stream, Prefetched):
            head = stream.first
        elif is_closed(response):
            head = response.content
        else:
            return
        model = None if not head else model_of(head)
        if model is not None:
            attempt.report_model(model)

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
        return self.lib.Request(
            request.method,
            url,
            headers=headers,
            content=request.content,
            extensions=dict(request.extensions),
        )

    def settle(self, response: Any, lease: Lease) -> Any:
        """A 2xx response as the client gets it: its body holds the window slot."""
        quota = self.gate.policy.quota
        # Budgets of the caller's own are settled against the usage the body reports.
        own = quota.settle == "usage" and (
            quota.requests_per_minute is not None or quota.tokens_per_minute is not None
        )
        if is_closed(response):
            # Already read and closed by the inner transport (a mock's
            # ``Response(content=...)`` is): nothing will close it again.
            if own:
                used = usage_of(response.content[-_USAGE_TAIL:])
                if used is not None:
                    lease.report_usage(used)
            lease.release()
        else:
            response.stream = self.leased(
                response.stream,
                lease,
                _keeps_chunks(response.headers),
                usage=own,
                held=self.held,
                # A body nobody reads for an attempt's time has been dropped: it lapses.
                idle_s=self.gate.policy.timeout.attempt_s,
            )
        return response


def given_up(exc: YieldgateError, request: Any, lib: Any) -> Any:
    """What the client gets when the Gate gives up: the last response, or an error raised.

    A response the upstream gave is returned as is, so that the client raises
    its own status error; the Gate's reason is in its
    ``extensions["yieldgate_error"]``. An error the upstream did not cause (a
    bad URL, say) is the library's own, as the client would have raised it
    without a Gate. Anything else (no connection, an open circuit, the
    deadline) is raised as an error that is both the library's and the
    Gate's (see ``library_error``), so that a client that wraps its library's
    errors (openai's ``APIConnectionError`` and ``APITimeoutError``,
    huggingface_hub's) still does, and ``except yieldgate.CircuitOpenError``
    still catches it.
    """
    last = exc.last_outcome
    if isinstance(last, Outcome) and is_response(last.value):
        last.value.extensions["yieldgate_error"] = exc
        return last.value
    cause = exc.__cause__
    if isinstance(exc, CallFailedError) and isinstance(cause, Exception):
        _raise_again(cause)
    if isinstance(exc, CallFailedError):
        raise exc
    # The copy is the Gate's error too; its cause stays the last attempt's error.
    raise library_error(exc, request, lib) from exc.__cause__


def _raise_again(error: Exception) -> NoReturn:
    """Raise ``error`` again, its chain as it was. Raised while the Gate's error (whose
    ``__cause__`` it is) is handled, it would get that error as its ``__context__``:
    a cycle, which a program walking ``__cause__`` and ``__context__`` follows forever."""
    context, suppress = error.__context__, error.__suppress_context__
    try:
        raise error
    finally:
        error.__context__, error.__suppress_context__ = context, suppress


_BOTH: dict[tuple[type[BaseException], type[YieldgateError]], type[YieldgateError]] = {}


def library_error(exc: YieldgateError, request: Any, lib: Any) -> YieldgateError:
    """``exc`` as an instance of a class that is both its own and the library's.

    A deadline is the library's ``TimeoutException`` (openai raises
    ``APITimeoutError``); any other give-up without a response is its
    ``TransportError`` (``APIConnectionError``). The copy has ``exc``'s
    message and fields (``attempts``, ``last_hint_s``, ...) and the request.
    """
    base = lib.TimeoutException if isinstance(exc, DeadlineExceededError) else lib.TransportError
    key = (base, type(exc))
    both = _BOTH.get(key)
    if both is None:
        name = type(exc).__name__
        both = _BOTH[key] = type(
            name,
            (type(exc), base),
            {"__module__": type(exc).__module__, "__qualname__": name, "__str__": _str},
        )
    error = both.__new__(both)
    error.args = exc.args
    error.__dict__.update(exc.__dict__)
    error._request = request  # type: ignore[attr-defined]  # the library's ``.request``
    return error


def _str(self: BaseException) -> str:
    return str(self.args[0]) if self.args else ""


def _request_timeout(timeouts: Any) -> float | None:
    """The longest of a request's timeouts (connect, read, write, pool), or ``None``
    when it has none, or one of them is unbounded."""
    if not isinstance(timeouts, dict) or not timeouts:
        return None
    values = list(timeouts.values())
    if any(v is None or not isinstance(v, int | float) or v <= 0 for v in values):
        return None
    return float(max(values))


def _priority(value: str | None) -> Priority:
    if value is None:
        return Priority.NORMAL
    found = parse_priority(value)
    if found is None:
        raise ValueError(f"{PRIORITY_HEADER} must be high, normal or low, got {value!r}")
    return found


def is_response(value: Any) -> bool:
    return hasattr(value, "status_code") and hasattr(value, "extensions")


def is_success(response: Any) -> bool:
    return 200 <= int(response.status_code) < 300


def is_closed(response: Any) -> bool:
    return bool(getattr(response, "is_closed", False))


def _keeps_chunks(response_headers: Any) -> bool:
    kind = str(response_headers.get(CONTENT_TYPE_HEADER, "")).lower()
    return kind.startswith("text/event-stream") or "ndjson" in kind or "jsonl" in kind


class ErrorBody:
    """The body of a non-2xx response, kept up to ``MAX_ERROR_BODY_BYTES``.

    A 429 with a 100 MiB body must not be downloaded on every attempt: the
    reader stops once ``add`` says the cap is passed and closes the
    connection (the rest is never read); ``response`` is then a copy of the
    response that carries what was read.
    """

    def __init__(self) -> None:
        self.body = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> bool:
        """Keep ``chunk``; true once the cap is reached and reading should stop."""
        self.body += chunk
        if len(self.body) > MAX_ERROR_BODY_BYTES:
            self.truncated = True
            del self.body[MAX_ERROR_BODY_BYTES:]
            return True
        return False

    def response(self, lib: Any, response: Any, request: Any) -> Any:
        headers = response.headers.copy()
        for name in _BODY_HEADERS:
            headers.pop(name, None)
        extensions = dict(response.extensions)
        if self.truncated:
            extensions["yieldgate_truncated"] = True
        return lib.Response(
            response.status_code,
            headers=headers,
            content=bytes(self.body),
            request=request,
            extensions=extensions,
        )


class HeldBodies:
    """The leased bodies one transport handed out and that are not closed yet, kept weakly.

    Closing the transport gives their slots back at once (``Signal.CANCELLED``):
    a stream the caller stopped reading but still refers to would otherwise
    keep its slot until it is garbage collected. Safe from any thread.
    """

    def __init__(self) -> None:
        self._bodies: weakref.WeakSet[LeasedBody] = weakref.WeakSet()
        self._lock = threading.Lock()

    def add(self, body: LeasedBody) -> None:
        with self._lock:
            self._bodies.add(body)

    def discard(self, body: LeasedBody) -> None:
        with self._lock:
            self._bodies.discard(body)

    def release_all(self) -> None:
        """Give back the slot of every body still held (the transport is closing)."""
        with self._lock:
            bodies = list(self._bodies)
            self._bodies.clear()
        for body in bodies:
            body.abandon()


class LeasedBody:
    """A response body that gives its window slot back when it is closed.

    Read to the end or closed early, the upstream did its work: success. A
    read that fails tells the window the attempt failed, and past the first
    chunk becomes a ``StreamInterruptedError``; a cancelled read, that it was
    cancelled. A body dropped without being closed returns the slot when it
    is garbage collected, or when the transport that made it (``held``) is
    closed. One dropped in a reference cycle (openai's streams keep
    themselves in one) is found by the collection that a caller waiting for
    a slot makes, within a budget, once nobody has read from it for a moment
    (``yieldgate.gate._dropped``). Nor is one lost with no collection to
    come: its slot lapses once nobody has read from it for ``idle_s`` (the
    attempt's timeout) and no read is under way (``Lease.lapse_after``).
    The async and sync bodies add only the iteration, marking each read
    (``_reading``).
    """

    def __init__(
        self,
        inner: Any,
        lease: Lease,
        keep: bool = False,
        *,
        usage: bool = False,
        held: HeldBodies | None = None,
        idle_s: float | None = None,
    ) -> None:
        self._inner = inner
        self._lease = lease
        self._signal = Signal.SUCCESS
        self._keep = keep
        self._received: list[bytes] = []
        self._delivered = 0
        # The end of the body, where its usage is (a JSON body's, a stream's last chunk).
        self._tail: bytearray | None = bytearray() if usage else None
        self._abandoned = False
        self._held = held
        # Dropped unclosed, the lease's own finalizer gives the slot back.
        lease.lapse_after(idle_s)
        if held is not None:
            held.add(self)

    def _reading(self) -> None:
        """A read of the next chunk begins: the body is in use, whatever it waits for."""
        self._lease.touch(reading=True)

    def _passed(self, chunk: bytes) -> None:
        self._lease.touch(reading=False)
        if self._keep:
            self._received.append(chunk)
        self._delivered += 1
        tail = self._tail
        if tail is not None:
            tail += chunk
            if len(tail) > _USAGE_TAIL:
                del tail[: len(tail) - _USAGE_TAIL]

    def _cancelled(self) -> None:
        self._signal = Signal.CANCELLED

    def _failed(self, exc: Exception) -> StreamInterruptedError | None:
        """Record a failed read; the error to raise instead of ``exc``, if any."""
        self._signal = Signal.FAILURE
        if not self._delivered or isinstance(exc, StreamInterruptedError):
            return None
        # Past the commit point: the caller has output a retry would repeat.
        return StreamInterruptedError(
            f"response body failed after {self._delivered} chunk(s), which were "
            f"delivered and are not repeated: {exc!r}",
            chunks=self._received,
        )

    def abandon(self) -> None:
        """Give the slot back now, as cancelled: the transport is closing under this body.

        A close or a failed read after this gives nothing back a second time.
        """
        self._abandoned = True
        self._lease.release(Signal.CANCELLED)

    def _release(self) -> None:
        if self._held is not None and not in_collection():
            # Inside a collection (a dropped stream's generator closing it), the
            # set's lock may be this thread's; the set forgets a collected body.
            self._held.discard(self)
        if self._abandoned:
            return
        if self._tail is not None and self._signal is Signal.SUCCESS:
            used = usage_of(bytes(self._tail))
            if used is not None:
                self._lease.report_usage(used)
        self._lease.release(self._signal)


class Prefetched:
    """A body whose first chunk was read inside the attempt.

    The attempt ends at the first non-empty chunk of a 2xx body, not at its
    headers: a failure before it is still the attempt's (retried, hedged).
    The chunk is handed out first when the body is read; ``rest`` is the
    iterator it came from, ``inner`` the body to close.
    """

    def __init__(self, first: bytes | None, rest: Any, inner: Any) -> None:
        self.first = first
        self.rest = rest
        self.inner = inner

    def take_first(self) -> bytes | None:
        first, self.first = self.first, None
        return first

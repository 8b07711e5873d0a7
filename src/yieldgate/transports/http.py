"""The Gate under an HTTP client: transports for httpx and httpx2, async and sync.

The official ``openai`` and ``huggingface_hub`` clients are built on httpx2
(openai 3.x, huggingface_hub 2.x) or on httpx (openai 2.x, the line LiteLLM
pins; huggingface_hub 1.x), two packages with the same API and separate
types; plain code uses either. ``http_client`` and ``gate_transport`` serve
all four combinations of library and sync or async: the library (the
*flavor*) is detected unless named (see ``http_client``). The logic is
written once (``_http_core``); a thin transport per library and kind does
the I/O, and is built on first use, so no library is imported before it is
needed.

Each request becomes one Gate call. An attempt sends the request through the
inner transport and the dialect classifies the response (error bodies are
read for that; 2xx bodies are not, they may be streams). Retries, waits on
hints, the window, the breaker and the budget are the Gate's. A 2xx response
keeps its window slot until its body is closed, so a stream read for a
minute occupies the window for that minute; closing the transport (the
client's ``close()`` / ``aclose()``) gives back the slots of the bodies it
handed out that are still open.

When the Gate gives up after an attempt that got a response (a 429 it stopped
waiting on, a 400 that is fatal), that response is returned as is, so the
client raises its own status error as it always did (``openai.RateLimitError``
and so on); the Gate's reason is in ``response.extensions["yieldgate_error"]``.
When no response came (circuit open, connection refused, deadline passed),
the ``YieldgateError`` is raised from the transport: openai 2.x wraps it in
``APIConnectionError`` (the Gate's error is its ``__cause__``), openai 3.x and
httpx let it through as is.

Per request, the header ``x-yieldgate-priority: high|normal|low`` sets the
call's priority (it is also sent, for servers that read it, as yieldgate's
reference server does). Use the client's own retries off (``max_retries=0``
for openai; ``yieldgate.openai_client`` does it): retrying is the Gate's job.

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

from typing import Any

from yieldgate.dialects import HttpDialect
from yieldgate.gate import USE_POLICY, Gate, UsePolicy
from yieldgate.protocol import DEADLINE_HEADER, PRIORITY_HEADER
from yieldgate.transports._flavor import Flavor, detect_flavor, flavor_of_transport, library
from yieldgate.transports._http_async import async_transport_class
from yieldgate.transports._http_core import MAX_ERROR_BODY_BYTES
from yieldgate.transports._http_sync import sync_transport_class

__all__ = [
    "DEADLINE_HEADER",
    "MAX_ERROR_BODY_BYTES",
    "PRIORITY_HEADER",
    "Flavor",
    "gate_transport",
    "http_client",
]


def _resolve(flavor: Flavor | None, inner: Any, sync: bool) -> Flavor:
    """The flavor to build, checked against the inner transport when there is one."""
    if flavor is not None:
        library(flavor)  # a clear error for a name that is neither library
    found = None if inner is None else flavor_of_transport(inner)
    if found is not None:
        inner_flavor, inner_kinds = found
        if flavor is not None and flavor != inner_flavor:
            raise ValueError(f"flavor={flavor!r}, but inner is a transport of {inner_flavor}")
        if sync not in inner_kinds:
            kinds = ("an async", "a sync") if sync else ("a sync", "an async")
            raise ValueError(f"inner is {kinds[0]} transport, but {kinds[1]} one was asked for")
    return flavor if flavor is not None else detect_flavor(inner=inner)


def gate_transport(
    gate: Gate,
    *,
    dialect: str | HttpDialect = "openai",
    flavor: Flavor | None = None,
    sync: bool = False,
    inner: Any = None,
    timeout: float | UsePolicy | None = USE_POLICY,
    allow_event_loop: bool = False,
) -> Any:
    """A transport of httpx or httpx2 that sends every request through ``gate``.

    An ``AsyncBaseTransport``, or with ``sync=True`` a ``BaseTransport``, of the
    library ``flavor`` names, else the one detected as for ``http_client``.
    ``inner`` is the transport that does the sending (default: the library's
    ``AsyncHTTPTransport()``, one per event loop, so that the client outlives an
    ``asyncio.run``; or ``HTTPTransport()``); ``dialect`` says what
    responses mean (a name or an ``HttpDialect``); ``timeout`` is each
    request's total time, retries and waits included (seconds; ``USE_POLICY``,
    the default: the Gate policy's ``total_s``; ``None``: no limit).

    A sync transport refuses a request made from a thread that runs an event loop
    (``BlockingCallError``: an ``async def`` calling a sync client), unless
    ``allow_event_loop=True`` (see ``Gate.call_sync``). A notebook's cell, which
    runs on the kernel's loop, is not refused: the request blocks the cell as the
    plain clients do (one warning per process).
    """
    chosen = _resolve(flavor, inner, sync)
    if not sync:
        if allow_event_loop:
            raise ValueError("allow_event_loop is for sync transports (sync=True)")
        return async_transport_class(chosen)(gate, dialect=dialect, inner=inner, timeout=timeout)
    return sync_transport_class(chosen)(
        gate, dialect=dialect, inner=inner, timeout=timeout, allow_event_loop=allow_event_loop
    )


def http_client(
    gate: Gate,
    *,
    dialect: str | HttpDialect = "openai",
    flavor: Flavor | None = None,
    sync: bool = False,
    inner: Any = None,
    timeout: float | UsePolicy | None = USE_POLICY,
    allow_event_loop: bool = False,
    **client_kwargs: Any,
) -> Any:
    """A ready ``AsyncClient`` (``sync=True``: a ``Client``) whose requests go through ``gate``.

    ``flavor`` names the library, ``"httpx2"`` or ``"httpx"``. Left out, it is
    detected: the library of ``inner`` when one is given, else the one the
    installed openai client is built on, else huggingface_hub's, else httpx2
    if it is installed, else httpx; the client's type says which. So a client
    handed to openai or huggingface_hub is of their library, whichever line
    is installed. Code of your own that catches the library's exceptions
    should name the flavor it catches.

    ``timeout`` is each request's total time in the Gate, retries and waits
    included (seconds; ``USE_POLICY``: the policy's ``total_s``; ``None``: no
    limit). The library's own network timeouts apply to each attempt: pass
    them per request, or set ``client.timeout``. ``allow_event_loop`` is as for
    ``gate_transport``. ``client_kwargs`` go to the client (``base_url``,
    ``headers``, ``follow_redirects``, ...)::

        client = openai.AsyncOpenAI(
            base_url=url, http_client=yieldgate.http_client(gate), max_retries=0
        )

    ``yieldgate.openai_client(gate, ...)`` does that in one call.
    """
    if "transport" in client_kwargs:
        raise TypeError("http_client builds the transport itself: pass yours as inner=")
    chosen = _resolve(flavor, inner, sync)
    transport = gate_transport(
        gate,
        dialect=dialect,
        flavor=chosen,
        sync=sync,
        inner=inner,
        timeout=timeout,
        allow_event_loop=allow_event_loop,
    )
    lib = library(chosen)
    client_class = lib.Client if sync else lib.AsyncClient
    # No network timeout of the library's own: the Gate bounds each attempt
    # (the policy's attempt_s) and each call; a client that wants one sets
    # ``client.timeout``, or passes one per request, which then bounds the call.
    return client_class(transport=transport, timeout=None, **client_kwargs)

"""The official clients under a Gate, each in one call.

``openai_client`` builds an ``openai.AsyncOpenAI`` (or ``openai.OpenAI``)
whose HTTP client is a Gate's and whose own retries are off;
``anthropic_client`` the same of ``anthropic.AsyncAnthropic`` (``Anthropic``).
``huggingface_clients`` sends huggingface_hub's clients through a Gate for
the length of a ``with`` block. Both pick the HTTP library the installed
client is built on, so either line of each works without naming one.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

from yieldgate.dialects import HttpDialect
from yieldgate.gate import USE_POLICY, Gate, UsePolicy
from yieldgate.transports._flavor import detect_flavor, library
from yieldgate.transports._hub_factories import enter_block, exit_block
from yieldgate.transports._per_loop import PerLoopTransport
from yieldgate.transports.http import gate_transport, http_client

__all__ = ["anthropic_client", "huggingface_clients", "openai_client"]


def _import(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"this needs the {package} package: pip install {package}") from None


def openai_client(
    gate: Gate,
    *,
    sync: bool = False,
    dialect: str | HttpDialect = "openai",
    timeout: float | UsePolicy | None = USE_POLICY,
    allow_event_loop: bool = False,
    **client_kwargs: Any,
) -> Any:
    """An ``openai.AsyncOpenAI`` (``sync=True``: ``openai.OpenAI``) that calls through ``gate``.

    Its ``http_client`` is ``yieldgate.http_client(gate, ...)`` of the library
    the installed openai is built on (httpx for 2.x, httpx2 for 3.x), and its
    own retries are off (``max_retries=0``): two retry loops would multiply
    attempts. ``client_kwargs`` go to the client (``base_url``, ``api_key``,
    ``organization``, ...)::

        client = yieldgate.openai_client(gate, base_url="http://127.0.0.1:8000/v1")
        reply = await client.chat.completions.create(model=..., messages=...)

    ``timeout`` is each request's total time in the Gate, retries and waits
    included, as for ``http_client``; openai's own per-request timeout keeps
    its default (``client.with_options(timeout=...)`` changes it).
    ``allow_event_loop=True`` lets a sync client be used from a thread that runs
    an event loop (a notebook's cell needs none: see ``gate_transport``).
    """
    return _sdk_client(
        "openai",
        ("OpenAI", "AsyncOpenAI"),
        gate,
        sync,
        dialect,
        timeout,
        allow_event_loop,
        client_kwargs,
    )


def anthropic_client(
    gate: Gate,
    *,
    sync: bool = False,
    dialect: str | HttpDialect = "anthropic",
    timeout: float | UsePolicy | None = USE_POLICY,
    allow_event_loop: bool = False,
    **client_kwargs: Any,
) -> Any:
    """An ``anthropic.AsyncAnthropic`` (``sync=True``: ``anthropic.Anthropic``) through ``gate``.

    As ``openai_client``: its ``http_client`` is the Gate's (of the library
    the installed anthropic is built on), its own retries are off
    (``max_retries=0``; anthropic's default is 2, backing off 0.5 to 8 s, which
    would multiply the Gate's attempts), and ``client_kwargs`` go to the client
    (``base_url``, ``api_key``, ``default_headers``, ...)::

        client = yieldgate.anthropic_client(gate)
        message = await client.messages.create(
            model="claude-sonnet-4-5", max_tokens=1024, messages=[...]
        )

    The ``anthropic`` dialect reads Anthropic's answers: a 529
    ``overloaded_error`` and a 429 ``rate_limit_error`` are yields (their
    ``retry-after`` the hint), and the ``anthropic-ratelimit-*`` headers pace
    requests, input tokens and output tokens apart. When the Gate gives up,
    the client raises what anthropic documents: the last response's status
    error (``anthropic.RateLimitError``, ``anthropic.InternalServerError`` for
    a 529) if one came, else ``anthropic.APITimeoutError`` for a deadline and
    ``anthropic.APIConnectionError`` for the rest, the Gate's error its
    ``__cause__``. ``timeout`` and ``allow_event_loop`` are as for
    ``openai_client``.
    """
    return _sdk_client(
        "anthropic",
        ("Anthropic", "AsyncAnthropic"),
        gate,
        sync,
        dialect,
        timeout,
        allow_event_loop,
        client_kwargs,
    )


def _sdk_client(
    package: str,
    classes: tuple[str, str],
    gate: Gate,
    sync: bool,
    dialect: str | HttpDialect,
    timeout: float | UsePolicy | None,
    allow_event_loop: bool,
    client_kwargs: dict[str, Any],
) -> Any:
    """One of the SDKs that take an ``http_client`` and ``max_retries`` (openai's, anthropic's)."""
    if "http_client" in client_kwargs:
        raise TypeError(
            f"{package}_client sets http_client itself (the Gate's); "
            f"build {package}'s client with yieldgate.http_client to choose your own"
        )
    retries = client_kwargs.pop("max_retries", 0)
    if retries != 0:
        raise TypeError(
            f"{package}_client sets max_retries=0 itself, got {retries!r}: the Gate retries "
            f"(set its RetryPolicy), and {package}'s own retries would multiply its attempts"
        )
    module = _import(package, package)
    flavor = detect_flavor(client=package)
    http = http_client(
        gate,
        dialect=dialect,
        flavor=flavor,
        sync=sync,
        timeout=timeout,
        allow_event_loop=allow_event_loop,
    )
    client_class = getattr(module, classes[0] if sync else classes[1])
    return _retries_stay_off(client_class(http_client=http, max_retries=0, **client_kwargs))


# The SDKs whose clients have been told once that a max_retries was ignored.
_WARNED: set[str] = set()


def _retries_stay_off(client: Any) -> Any:
    """``client``, whose ``with_options`` (``copy``) keeps ``max_retries`` at 0.

    Frameworks call ``client.with_options(max_retries=N)`` on a client they are
    given: refused, they would break; followed, N retries of the SDK's own
    would run under each of the Gate's attempts. The copy keeps the SDK's
    retries off, and the first such call of the process warns.
    """
    copy = client.copy
    package = type(client).__module__.partition(".")[0]

    def copy_without_retries(*args: Any, **kwargs: Any) -> Any:
        retries = kwargs.get("max_retries")
        if isinstance(retries, int) and retries != 0:
            kwargs["max_retries"] = 0
            if package not in _WARNED:
                _WARNED.add(package)
                warnings.warn(
                    f"max_retries={retries} ignored: a yieldgate {package} client keeps "
                    f"{package}'s retries off, the Gate retries (set its RetryPolicy)",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return _retries_stay_off(copy(*args, **kwargs))

    client.copy = client.with_options = copy_without_retries
    return client


@contextlib.contextmanager
def huggingface_clients(
    gate: Gate,
    *,
    dialect: str | HttpDialect = "huggingface",
    timeout: float | UsePolicy | None = USE_POLICY,
    include_hub: bool = False,
    allow_event_loop: bool = False,
) -> Iterator[None]:
    """Send huggingface_hub's HTTP clients through ``gate`` inside a ``with`` block.

    huggingface_hub takes its clients from two process-wide factories; this
    installs the Gate's (``yieldgate.http_client`` of the library the
    installed huggingface_hub is built on, sync and async) and puts back the
    ones that were installed before when the block exits, also on an error::

        with yieldgate.huggingface_clients(gate):
            async with AsyncInferenceClient(model=url) as client:
                text = await client.text_generation("Once upon a time")

    The inference requests go through the Gate. huggingface_hub's own calls to
    the Hub (``huggingface_hub.constants.ENDPOINT``: model info, downloads, its
    background requests) go around it, unless ``include_hub=True``: the Hub is
    another upstream, and its failures (an offline machine cannot resolve
    huggingface.co) must not open the breaker of the endpoint the Gate guards.
    ``dialect``, ``timeout`` and ``allow_event_loop`` (for the sync clients) are as
    for ``http_client``; like the library's own clients, the Gate's follow
    redirects and set no network timeout of their own (the inference clients pass
    theirs per request).

    The factories are process-wide: every thread's huggingface_hub calls go
    through the block's Gate while it is active. Blocks nest in one thread
    (each puts back what it replaced); entering one while a block of another
    thread is active raises ``HubClientsInUseError`` at once. huggingface_hub's
    shared sync client (``get_session()``), which other threads may be using,
    is set aside, not closed, and is the shared one again after the block; the
    sync clients the block made are closed when it exits.
    """
    hub_module = _import("huggingface_hub", "huggingface_hub")
    hub_http = importlib.import_module("huggingface_hub.utils._http")
    flavor = detect_flavor(client="huggingface_hub")

    lib = library(flavor)
    hub_origin = (
        None if include_hub else _origin(importlib.import_module("huggingface_hub.constants"))
    )

    def make(sync: bool) -> Any:
        gated = gate_transport(
            gate,
            dialect=dialect,
            flavor=flavor,
            sync=sync,
            timeout=timeout,
            allow_event_loop=allow_event_loop and sync,
        )
        transport = gated
        if hub_origin is not None:
            plain = lib.HTTPTransport() if sync else PerLoopTransport(lib.AsyncHTTPTransport)
            transport = _around_the_hub(lib, sync, hub_origin, gated, plain)
        client_class = lib.Client if sync else lib.AsyncClient
        return client_class(
            transport=transport,
            follow_redirects=True,
            event_hooks=_hub_hooks(hub_http, sync),
            timeout=None,
        )

    block = enter_block(hub_module, hub_http, gate.name, lambda: make(False), lambda: make(True))
    try:
        yield
    finally:
        exit_block(hub_module, hub_http, block)


def _origin(constants: Any) -> tuple[str, str, int | None]:
    url = urlsplit(str(constants.ENDPOINT))
    return (url.scheme, url.hostname or "", url.port)


def _around_the_hub(
    lib: Any, sync: bool, hub_origin: tuple[str, str, int | None], gated: Any, plain: Any
) -> Any:
    """A transport that sends requests to the Hub by ``plain`` and the rest by ``gated``."""

    def to_hub(request: Any) -> bool:
        url = request.url
        return (url.scheme, url.host, url.port) == hub_origin

    if sync:

        class AroundTheHub(lib.BaseTransport):  # type: ignore[misc]
            def handle_request(self, request: Any) -> Any:
                return (plain if to_hub(request) else gated).handle_request(request)

            def close(self) -> None:
                gated.close()
                plain.close()

        return AroundTheHub()

    class AsyncAroundTheHub(lib.AsyncBaseTransport):  # type: ignore[misc]
        async def handle_async_request(self, request: Any) -> Any:
            return await (plain if to_hub(request) else gated).handle_async_request(request)

        async def aclose(self) -> None:
            await gated.aclose()
            await plain.aclose()

    return AsyncAroundTheHub()


def _hub_hooks(hub_http: Any, sync: bool) -> dict[str, list[Any]]:
    """The event hooks huggingface_hub's own clients have (offline mode, request ids)."""
    names = (
        {"request": ["hf_request_event_hook"]}
        if sync
        else {
            "request": ["async_hf_request_event_hook"],
            "response": ["async_hf_response_event_hook"],
        }
    )
    hooks: dict[str, list[Any]] = {}
    for event, functions in names.items():
        found = [getattr(hub_http, name) for name in functions if hasattr(hub_http, name)]
        if found:
            hooks[event] = found
    return hooks

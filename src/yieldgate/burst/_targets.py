"""Targets: where a burst goes, and one request sent there as a user would send it.

``tcp://HOST:PORT`` goes through ``yieldgate.GovernedClient``;
``openai+http://HOST:PORT`` through the official ``openai`` client,
``anthropic+http://HOST:PORT`` through the official ``anthropic`` client,
``hf+http://HOST:PORT[/models/NAME]`` through ``huggingface_hub``'s
``AsyncInferenceClient`` and ``tgi+http://HOST:PORT`` through plain httpx,
and ``raw+http://HOST:PORT`` (OpenAI chat completions) through the lean
client of ``_rawhttp``, a load generator's,
each with ``yieldgate.http_client`` under it. Every strategy sends through a
Gate: the ``yieldgate`` strategy's own, or a pass-through Gate (one attempt,
no limit) for the baselines, which counts their attempts the same way.
"""

from __future__ import annotations

import contextlib
import json
import math
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import urlsplit

import yieldgate
from yieldgate.burst._unreachable import UNREACHABLE, unreachable_reason
from yieldgate.gate import USE_POLICY
from yieldgate.protocol import PRIORITY_HEADER

__all__ = ["Request", "Send", "StatsSource", "Target", "TargetKind", "Workload", "open_target"]

TargetKind = Literal["tcp", "openai", "anthropic", "hf", "tgi", "raw"]

_SCHEMES: dict[str, TargetKind] = {
    "tcp": "tcp",
    "openai+http": "openai",
    "anthropic+http": "anthropic",
    "hf+http": "hf",
    "tgi+http": "tgi",
    "raw+http": "raw",
}
_DIALECTS: dict[TargetKind, str] = {
    "tcp": "governed",
    "openai": "openai",
    "anthropic": "anthropic",
    "hf": "huggingface",
    "tgi": "tgi",
    "raw": "openai",
}


@dataclass(frozen=True, slots=True)
class Target:
    """A parsed ``--target``. ``port`` is ``None`` for a bare scheme (``tcp://``),
    which the tool fills in from a server it starts itself."""

    kind: TargetKind
    host: str = "127.0.0.1"
    port: int | None = None
    path: str = ""

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url.strip())
        kind = _SCHEMES.get(parts.scheme.lower())
        if kind is None:
            raise ValueError(
                f"target {url!r}: the scheme must be one of "
                + ", ".join(f"{s}://" for s in _SCHEMES)
            )
        try:
            port = parts.port
        except ValueError:
            raise ValueError(f"target {url!r}: bad port") from None
        host = parts.hostname or "127.0.0.1"
        path = parts.path.rstrip("/")
        if kind == "tcp" and path:
            raise ValueError(f"target {url!r}: a tcp:// target has no path")
        return cls(kind=kind, host=host, port=port, path=path)

    @property
    def is_http(self) -> bool:
        return self.kind != "tcp"

    @property
    def default_dialect(self) -> str:
        return _DIALECTS[self.kind]

    def at(self, host: str, port: int) -> Target:
        """The same target at another address (a server the tool started)."""
        return replace(self, host=host, port=port)

    @property
    def url(self) -> str:
        scheme = next(s for s, k in _SCHEMES.items() if k == self.kind)
        where = f"{self.host}:{self.port}" if self.port is not None else ""
        return f"{scheme}://{where}{self.path}"

    @property
    def http_base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def require_address(self) -> None:
        if self.port is None:
            raise ValueError(f"target {self.url!r} has no port: give HOST:PORT, or --serve")


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """What each request asks for.

    ``prompt_tokens`` is a weighted mix of prompt lengths (one byte is one
    token for the harness backend); empty sends a short ``request N`` text.
    ``max_tokens`` becomes each API's own field (omitted when ``None``).
    ``timeout_s``: the caller's time-out, given to the client as its request
    timeout as a caller would (the Gate then knows the call's deadline).
    """

    stream: bool = False
    prompt_tokens: tuple[tuple[int, float], ...] = ()
    max_tokens: int | None = None
    model: str = "yieldgate-sim"
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        for tokens, weight in self.prompt_tokens:
            if tokens < 1 or not (weight > 0 and math.isfinite(weight)):
                raise ValueError("prompt_tokens needs lengths >= 1 and weights > 0")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError("max_tokens must be >= 1")

    def prompts(self, requests: int, seed: int) -> list[str]:
        """The prompts of a burst of ``requests``, their lengths drawn from ``seed``."""
        draws = random.Random(seed)  # noqa: S311 - prompt lengths, not secrets
        return [self.prompt(i, draws.random()) for i in range(requests)]

    def prompt(self, index: int, draw: float) -> str:
        """The prompt of request ``index``; ``draw`` in [0, 1) picks its length from the mix."""
        head = f"request {index} "
        if not self.prompt_tokens:
            return head.rstrip()
        total = sum(w for _, w in self.prompt_tokens)
        edge = draw * total
        length = self.prompt_tokens[-1][0]
        for tokens, weight in self.prompt_tokens:
            if edge < weight:
                length = tokens
                break
            edge -= weight
        return self.prompt_of_length(index, length)

    @staticmethod
    def prompt_of_length(index: int, length: int) -> str:
        """Request ``index``'s prompt, ``length`` characters long (a trace's ``prompt_chars``)."""
        head = f"request {index} "
        # A distinct head keeps prefix caching from serving prompts for free.
        filler = "the quick brown fox jumps over the lazy dog. "
        text = head + filler * (length // len(filler) + 1)
        return text[:length]


@dataclass(slots=True)
class Request:
    """One request of a run, as the client saw it. Times are seconds from the run's start."""

    index: int
    arrival_s: float
    end_s: float | None = None
    ok: bool = False
    error: str | None = None
    chunk_s: list[float] = field(default_factory=list)
    origin: float = 0.0  # time.monotonic() at the start of the run
    max_tokens: int | None = None  # a trace's own; None: the workload's
    priority: str | None = None  # --priority-mix: high, normal or low; None: not sent
    unreachable: str | None = None  # why it could not reach the target, and where

    def restart(self) -> None:
        """A new attempt of the whole request (a baseline's retry): forget its chunks."""
        self.chunk_s.clear()

    def chunk(self) -> None:
        self.chunk_s.append(time.monotonic() - self.origin)


Send = Callable[[str, Request], Awaitable[None]]
StatsSource = Callable[[], Awaitable[dict[str, Any] | None]]


class HttpStatusFailure(Exception):
    """A plain-httpx reply (TGI target) that was not a success."""

    def __init__(self, response: Any) -> None:
        super().__init__(f"HTTP {response.status_code}")
        self.response = response


def _find_yieldgate_error(exc: BaseException) -> yieldgate.YieldgateError | None:
    """The Gate's verdict behind ``exc``: the error itself, its causes, or the
    ``yieldgate_error`` extension of a response the Gate handed back."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, yieldgate.YieldgateError):
            return current
        extensions = getattr(getattr(current, "response", None), "extensions", None)
        if isinstance(extensions, Mapping):
            found = extensions.get("yieldgate_error")
            if isinstance(found, yieldgate.YieldgateError):
                return found
        current = current.__cause__ or current.__context__
    return None


def error_kind(exc: BaseException) -> str:
    """A short name for why a request failed: ``unreachable`` when it could not connect
    (``_unreachable``), else the Gate's error class, else the HTTP status, else the
    exception's class. The same name in every report: table, JSON, CSV and HTML."""
    if unreachable_reason(exc) is not None:
        return UNREACHABLE
    found = _find_yieldgate_error(exc)
    if found is not None:
        return type(found).__name__
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(status, int):
        return f"HTTP {status}"
    return type(exc).__name__


def retry_signal(exc: BaseException) -> tuple[bool, float | None]:
    """For the baselines: may another attempt help, and what hint came back.

    A pass-through Gate turns congestion into ``YieldExhaustedError`` and a
    retryable failure into ``RetriesExhaustedError``; both carry the hint.
    """
    found = _find_yieldgate_error(exc)
    if isinstance(found, yieldgate.YieldExhaustedError | yieldgate.RetriesExhaustedError):
        return True, found.last_hint_s
    return False, None


def _max_tokens(workload: Workload, request: Request) -> int | None:
    return request.max_tokens if request.max_tokens is not None else workload.max_tokens


# -- opening a target -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_target(
    target: Target,
    gate: yieldgate.Gate,
    workload: Workload,
    *,
    dialect: str | None = None,
    native_retries: int = 0,
) -> AsyncIterator[tuple[Send, StatsSource]]:
    """A ``send(prompt, request)`` that makes one request through ``gate``, and a
    ``stats()`` that reads the server's counters (``None`` when it has none).

    ``native_retries`` is the official openai or anthropic client's own
    ``max_retries`` (the ``openai-default`` or ``anthropic-default`` strategy on
    its own client's target); every other client does not retry.
    """
    target.require_address()
    if target.kind == "tcp":
        async with _open_tcp(target, gate, workload) as opened:
            yield opened
        return
    import httpx  # here: the package's import pulls in its CLI (rich, click)

    chosen = dialect or target.default_dialect
    async with httpx.AsyncClient(base_url=target.http_base, timeout=10.0) as plain:
        stats = _http_stats(plain)
        if target.kind == "raw":
            from yieldgate.burst._rawhttp import open_raw

            async with open_raw(target, gate, workload, chosen) as send:
                yield send, stats
        elif target.kind == "openai":
            async with _open_openai(target, gate, workload, chosen, native_retries) as send:
                yield send, stats
        elif target.kind == "anthropic":
            from yieldgate.burst._anthropic_target import open_anthropic

            async with open_anthropic(target, gate, workload, chosen, native_retries) as send:
                yield send, stats
        elif target.kind == "hf":
            async with _open_hf(target, gate, workload, chosen) as send:
                yield send, stats
        else:
            async with _open_tgi(target, gate, workload, chosen) as send:
                yield send, stats


def _http_stats(client: Any) -> StatsSource:
    import httpx

    available = True

    async def stats() -> dict[str, Any] | None:
        nonlocal available
        if not available:
            return None
        try:
            response = await client.get("/stats")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            available = False  # not a yieldgate server: no counters, ever
            return None
        counters: dict[str, Any] = response.json()
        return counters

    return stats


@contextlib.asynccontextmanager
async def _open_tcp(
    target: Target, gate: yieldgate.Gate, workload: Workload
) -> AsyncIterator[tuple[Send, StatsSource]]:
    async with yieldgate.GovernedClient(target.url, gate=gate) as client:

        async def send(prompt: str, request: Request) -> None:
            request.restart()
            max_tokens = _max_tokens(workload, request)
            params = {"max_tokens": max_tokens} if max_tokens is not None else None
            timeout = USE_POLICY if workload.timeout_s is None else workload.timeout_s
            if not workload.stream:
                await client.submit(
                    prompt, params=params, priority=request.priority, timeout=timeout
                )
                return
            async with client.stream(
                prompt, params=params, priority=request.priority, timeout=timeout
            ) as chunks:
                async for _ in chunks:
                    request.chunk()

        async def stats() -> dict[str, Any] | None:
            try:
                return await client.stats()
            except yieldgate.YieldgateError:
                return None

        yield send, stats


@contextlib.asynccontextmanager
async def _open_openai(
    target: Target, gate: yieldgate.Gate, workload: Workload, dialect: str, retries: int
) -> AsyncIterator[Send]:
    try:
        import openai
    except ImportError:
        raise ImportError("an openai+http:// target needs the openai package") from None
    client = openai.AsyncOpenAI(
        base_url=f"{target.http_base}{target.path}/v1",
        api_key="unused",
        http_client=yieldgate.http_client(gate, dialect=dialect),
        max_retries=retries,
    )

    async def send(prompt: str, request: Request) -> None:
        request.restart()
        extra: dict[str, Any] = {}
        max_tokens = _max_tokens(workload, request)
        if max_tokens is not None:
            extra["max_tokens"] = max_tokens
        if request.priority is not None:
            extra["extra_headers"] = {PRIORITY_HEADER: request.priority}
        if workload.timeout_s is not None:
            extra["timeout"] = workload.timeout_s  # the Gate's transport reads it as the deadline
        messages: Any = [{"role": "user", "content": prompt}]
        if not workload.stream:
            await client.chat.completions.create(model=workload.model, messages=messages, **extra)
            return
        stream = await client.chat.completions.create(
            model=workload.model, messages=messages, stream=True, **extra
        )
        async with stream:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    request.chunk()

    async with client:
        yield send


@contextlib.asynccontextmanager
async def _open_hf(
    target: Target, gate: yieldgate.Gate, workload: Workload, dialect: str
) -> AsyncIterator[Send]:
    try:
        from huggingface_hub import AsyncInferenceClient
    except ImportError:
        raise ImportError("an hf+http:// target needs the huggingface_hub package") from None
    path = target.path or f"/models/{workload.model}"
    # huggingface_hub takes its HTTP clients from global factories: the Gate's
    # for this run only, then the ones before come back.
    with yieldgate.huggingface_clients(gate, dialect=dialect):
        async with AsyncInferenceClient(model=f"{target.http_base}{path}") as client:

            async def send(prompt: str, request: Request) -> None:
                request.restart()
                max_tokens = _max_tokens(workload, request)
                if not workload.stream:
                    await client.text_generation(prompt, max_new_tokens=max_tokens)
                    return
                tokens = await client.text_generation(
                    prompt, max_new_tokens=max_tokens, stream=True
                )
                async for token in tokens:
                    if token:
                        request.chunk()

            yield send


@contextlib.asynccontextmanager
async def _open_tgi(
    target: Target, gate: yieldgate.Gate, workload: Workload, dialect: str
) -> AsyncIterator[Send]:
    client = yieldgate.http_client(gate, dialect=dialect, flavor="httpx", base_url=target.http_base)
    client.timeout = 120.0  # the library's network timeouts, per attempt
    async with client:

        async def send(prompt: str, request: Request) -> None:
            request.restart()
            parameters: dict[str, Any] = {}
            max_tokens = _max_tokens(workload, request)
            if max_tokens is not None:
                parameters["max_new_tokens"] = max_tokens
            body = {"inputs": prompt, "parameters": parameters}
            headers = {} if request.priority is None else {PRIORITY_HEADER: request.priority}
            if not workload.stream:
                response = await client.post(f"{target.path}/generate", json=body, headers=headers)
                if response.status_code >= 400:
                    raise HttpStatusFailure(response)
                return
            async with client.stream(
                "POST", f"{target.path}/generate_stream", json=body, headers=headers
            ) as reply:
                if reply.status_code >= 400:
                    await reply.aread()
                    raise HttpStatusFailure(reply)
                async for line in reply.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = json.loads(line[5:])
                    token = event.get("token") or {}
                    if token.get("text"):
                        request.chunk()

        yield send

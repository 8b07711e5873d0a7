"""``anthropic+http://HOST:PORT``: a burst through the official ``anthropic`` client.

Each request is one ``client.messages.create`` (``stream=True`` for a
streamed workload, whose ``content_block_delta`` events are its chunks),
with the Gate's HTTP client under the client. The client's own retries are
the ``anthropic-default`` strategy's (``max_retries=2``) and off for every
other strategy. The Messages API requires ``max_tokens``: a workload without
one asks for ``DEFAULT_MAX_TOKENS``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import yieldgate
from yieldgate.protocol import PRIORITY_HEADER
from yieldgate.transports._flavor import detect_flavor

__all__ = ["DEFAULT_MAX_TOKENS", "open_anthropic"]

DEFAULT_MAX_TOKENS = 64
"""``max_tokens`` of a request whose workload and trace name none (the API requires it)."""


@contextlib.asynccontextmanager
async def open_anthropic(
    target: Any, gate: yieldgate.Gate, workload: Any, dialect: str, retries: int
) -> AsyncIterator[Any]:
    """The ``send(prompt, request)`` of an ``anthropic+http://`` target (see
    ``_targets.open_target``): one ``messages.create`` through ``gate``."""
    try:
        import anthropic
    except ImportError:
        raise ImportError("an anthropic+http:// target needs the anthropic package") from None
    flavor = detect_flavor(client="anthropic")
    client = anthropic.AsyncAnthropic(
        base_url=f"{target.http_base}{target.path}",
        api_key="unused",
        http_client=yieldgate.http_client(gate, dialect=dialect, flavor=flavor),
        max_retries=retries,
    )

    async def send(prompt: str, request: Any) -> None:
        request.restart()
        extra: dict[str, Any] = {}
        if request.priority is not None:
            extra["extra_headers"] = {PRIORITY_HEADER: request.priority}
        if workload.timeout_s is not None:
            extra["timeout"] = workload.timeout_s  # the Gate's transport reads it as the deadline
        max_tokens = request.max_tokens or workload.max_tokens or DEFAULT_MAX_TOKENS
        messages: Any = [{"role": "user", "content": prompt}]
        if not workload.stream:
            await client.messages.create(
                model=workload.model, max_tokens=max_tokens, messages=messages, **extra
            )
            return
        stream = await client.messages.create(
            model=workload.model, max_tokens=max_tokens, messages=messages, stream=True, **extra
        )
        async with stream:
            async for event in stream:
                if event.type == "content_block_delta":
                    request.chunk()

    async with client:
        yield send

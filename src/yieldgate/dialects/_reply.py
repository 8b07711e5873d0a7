"""One non-2xx HTTP response, read once for every rule of a dialect.

A rule is a function of a ``Reply`` that returns an ``Outcome`` when it
recognises the reply, else ``None``. The reply holds what every rule needs:
the status, the hint and ``x-should-retry`` verdict of its headers, its body
decoded as JSON (``None`` when it is not JSON) and, for a body that is not
JSON, the start of it as text (some servers answer a refusal in plain text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from yieldgate._exceptions import RemoteError
from yieldgate.dialects._hints import retry_hint_s, should_retry
from yieldgate.gate import Outcome

__all__ = ["Reply", "ResponseLike", "Rule", "read_reply"]

_MAX_BODY_PARSE = 1 << 20  # bigger error bodies are not parsed
_MAX_TEXT = 200  # characters of a plain-text body kept for rules and messages


class ResponseLike(Protocol):
    """What a dialect reads of a response: httpx's and httpx2's ``Response`` both fit.

    ``content`` is only read for non-2xx responses, and must be loaded then.
    """

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Reply:
    """One non-2xx response, parsed once for every rule."""

    status: int
    hint_s: float | None
    retry: bool | None
    body: Any  # decoded JSON, or None
    text: str  # the start of a body that is not JSON, else ""
    response: ResponseLike

    def error(self, retryable: bool) -> RemoteError:
        detail = _error_message(self.body) or self.text
        message = f"HTTP {self.status}" + (f": {detail}" if detail else "")
        return RemoteError(message, code=f"http_{self.status}", retryable=retryable)

    def field(self, *path: str) -> Any:
        value = self.body
        for key in path:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return value

    def header(self, name: str) -> str | None:
        return self.response.headers.get(name)


Rule = Callable[[Reply], Outcome | None]


def read_reply(response: ResponseLike, *, parse_body: bool = True) -> Reply:
    """The ``Reply`` of a non-2xx ``response``; its body is read only if ``parse_body``."""
    headers = response.headers
    content = _content(response) if parse_body else b""
    body = _json(content)
    text = "" if body is not None else content[: _MAX_TEXT * 4].decode("utf-8", "replace")
    return Reply(
        response.status_code,
        retry_hint_s(headers),
        should_retry(headers),
        body,
        text.strip()[:_MAX_TEXT],
        response,
    )


def _error_message(body: Any) -> str:
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            error = error.get("message")
        if error is None:  # a flat {"message": ..., "type": ...} body (NVIDIA Dynamo's)
            error = body.get("message")
        if isinstance(error, str):
            return error[:_MAX_TEXT]
    return ""


def _content(response: ResponseLike) -> bytes:
    try:
        content = response.content
    except Exception:  # not loaded: the caller did not read the body
        return b""
    if len(content) > _MAX_BODY_PARSE:
        return b""
    return content


def _json(content: bytes) -> Any:
    if not content:
        return None
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return None

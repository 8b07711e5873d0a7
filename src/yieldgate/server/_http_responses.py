"""The raw ASGI answers both the routes and the middleware of the HTTP app send.

``send_json`` starts and ends a JSON response in one go (``JSON`` is its
content-type header); ``RETRY`` and
``NO_RETRY`` are the ``x-should-retry`` header the official clients read;
``route_error`` is the error body of a request no dialect handled (a 401, an
unknown route); ``anthropic_error`` is an error in Anthropic's shape, its
type read from the status as Anthropic's error reference lists them.
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from yieldgate._headers import CONTENT_LENGTH_HEADER, CONTENT_TYPE_HEADER, SHOULD_RETRY_HEADER
from yieldgate.protocol import ErrorCode

__all__ = [
    "JSON",
    "MESSAGES_PATH",
    "NO_RETRY",
    "RETRY",
    "anthropic_error",
    "route_error",
    "send_json",
]

JSON = (CONTENT_TYPE_HEADER.encode(), b"application/json")
_CONTENT_LENGTH = CONTENT_LENGTH_HEADER.encode()
RETRY = (SHOULD_RETRY_HEADER.encode(), b"true")
NO_RETRY = (SHOULD_RETRY_HEADER.encode(), b"false")
# The Messages API's path: what no dialect handled there is answered in Anthropic's shape.
MESSAGES_PATH = "/v1/messages"
# Anthropic's error type for each status it names; another 4xx is an invalid request,
# another 5xx an api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    raw_headers = [JSON, (_CONTENT_LENGTH, str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``, typed by ``status``."""
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def route_error(path: str, code: ErrorCode, message: str, status: int) -> dict[str, Any]:
    """An error body for ``path`` when no dialect handled it: Anthropic's shape under
    ``/v1/messages``, OpenAI's elsewhere under ``/v1/``, the HuggingFace / TGI shape
    elsewhere."""
    if path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/"):
        return anthropic_error(status, message)
    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code.value}}
    return {"error": message, "error_type": code.value, "code": code.value}

"""The raw ASGI answers both the routes and the middleware of the HTTP app send.

``send_json`` starts and ends a JSON response in one go (``JSON`` is its
content-type header); ``RETRY`` and
``NO_RETRY`` are the ``x-should-retry`` header the official clients read;
``route_error`` is the error body of a request no dialect handled (a 401, an
unknown route).
"""

from __future__ import annotations

from typing import Any

from starlette.types import Send

from yieldgate._headers import CONTENT_LENGTH_HEADER, CONTENT_TYPE_HEADER, SHOULD_RETRY_HEADER
from yieldgate.protocol import ErrorCode

__all__ = ["JSON", "NO_RETRY", "RETRY", "route_error", "send_json"]

JSON = (CONTENT_TYPE_HEADER.encode(), b"application/json")
_CONTENT_LENGTH = CONTENT_LENGTH_HEADER.encode()
RETRY = (SHOULD_RETRY_HEADER.encode(), b"true")
NO_RETRY = (SHOULD_RETRY_HEADER.encode(), b"false")


async def send_json(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    raw_headers = [JSON, (_CONTENT_LENGTH, str(len(body)).encode()), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def route_error(path: str, code: ErrorCode, message: str, status: int) -> dict[str, Any]:
    """An error body for ``path`` when no dialect handled it: OpenAI's shape under
    ``/v1/``, the HuggingFace / TGI shape elsewhere."""
    if path.startswith("/v1/"):
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code.value}}
    return {"error": message, "error_type": code.value, "code": code.value}

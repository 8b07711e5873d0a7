"""The raw ASGI answers both the routes and the middleware of the HTTP app send.

``send_json`` starts and ends a JSON response in one go (``JSON`` is its
content-type header); ``RETRY`` and
``NO_RETRY`` are the ``x-should-retry`` header the official clients read;
``route_error`` is the error body of a request no dialect handled (a 401, an
unknown route, a crash), in the shape of its API family (``family_error``;
``path_family`` guesses the family from a path alone); ``anthropic_error`` is
an error in Anthropic's shape, its type read from the status as Anthropic's
error reference lists them.
"""

from __future__ import annotations

from typing import Any, Literal

from starlette.types import Send

from yieldgate._headers import CONTENT_LENGTH_HEADER, CONTENT_TYPE_HEADER, SHOULD_RETRY_HEADER
from yieldgate.protocol import ErrorCode

__all__ = [
    "JSON",
    "MESSAGES_PATH",
    "NO_RETRY",
    "RETRY",
    "Family",
    "anthropic_error",
    "family_error",
    "path_family",
    "route_error",
    "send_json",
]

JSON = (CONTENT_TYPE_HEADER.encode(), b"application/json")
_CONTENT_LENGTH = CONTENT_LENGTH_HEADER.encode()
RETRY = (SHOULD_RETRY_HEADER.encode(), b"true")
NO_RETRY = (SHOULD_RETRY_HEADER.encode(), b"false")
# The Messages API's path: what no dialect handled there is answered in Anthropic's shape.
MESSAGES_PATH = "/v1/messages"
_BARE_MESSAGES = "/messages"
_GENERATE = "/generate"
# The API families whose error shapes the routes answer in.
Family = Literal["openai", "anthropic", "huggingface", "tgi"]
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


def path_family(path: str) -> Family:
    """The API family a request for ``path`` most likely speaks, from the path alone.

    Anthropic's under ``/v1/messages`` (also behind a prefix: ``/v1/v1/messages``)
    and at ``/messages``; OpenAI's under ``/v1/`` (the HuggingFace endpoints'
    ``.../v1/chat/completions`` too) and Azure's ``/openai/``; TGI's at ``/`` and
    ``/generate*``; the HuggingFace Inference API's elsewhere (``/models/``, and any
    other path: its plain ``{"error": "..."}`` is what huggingface_hub and a person
    read best, while an ``error_type`` would make huggingface_hub's
    ``text_generation`` raise a TGI error that hides the status).
    """
    if (
        path.endswith(MESSAGES_PATH)
        or MESSAGES_PATH + "/" in path
        or path == _BARE_MESSAGES
        or path.startswith(_BARE_MESSAGES + "/")
    ):
        return "anthropic"
    if path.startswith(("/v1/", "/openai/")) or "/v1/" in path or path == "/v1":
        return "openai"
    if path == "/" or path.startswith(_GENERATE):
        return "tgi"
    return "huggingface"


def family_error(family: Family, status: int, code: ErrorCode, message: str) -> dict[str, Any]:
    """An error body in ``family``'s shape, as that family's routes answer errors.

    OpenAI: ``{"error": {"message", "type", "param", "code"}}``; Anthropic:
    ``{"type": "error", "error": {"type", "message"}}``; the HuggingFace Inference
    API: ``{"error": message}``; TGI: ``{"error": message, "error_type"}``. Each
    but Anthropic's also carries the protocol's error code.
    """
    if family == "anthropic":
        return anthropic_error(status, message)
    if family == "openai":
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": code.value}}
    if family == "huggingface":
        return {"error": message, "code": code.value}
    return {"error": message, "error_type": code.value, "code": code.value}


def route_error(
    path: str, code: ErrorCode, message: str, status: int, family: Family | None = None
) -> dict[str, Any]:
    """An error body for ``path`` when no dialect handled it: in ``family``'s shape, by
    default the path's (``path_family``)."""
    return family_error(family or path_family(path), status, code, message)

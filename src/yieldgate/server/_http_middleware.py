"""The HTTP app's middleware: the bearer-token check and the request counts.

``Secret`` checks ``Authorization: Bearer <secret>`` (or Anthropic's
``x-api-key: <secret>``) in constant time and writes the 401;
``RequireSecret`` puts it in front of a route (every route but
``/health``); ``Counted`` counts every answered request by route and
status, for ``/metrics`` and ``/stats``.
"""

from __future__ import annotations

import hmac
from collections import Counter
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from yieldgate._headers import AUTHORIZATION_HEADER, WWW_AUTHENTICATE_HEADER, X_API_KEY_HEADER
from yieldgate.protocol import ErrorCode
from yieldgate.server._http_dialects import dumps
from yieldgate.server._http_responses import NO_RETRY, Family, route_error, send_json

if TYPE_CHECKING:
    from yieldgate.server._http_front import Front

__all__ = ["Counted", "RequireSecret", "Secret"]

_BEARER_CHALLENGE = (WWW_AUTHENTICATE_HEADER.encode(), b"Bearer")
_AUTHORIZATION = AUTHORIZATION_HEADER.encode()
_API_KEY = X_API_KEY_HEADER.encode()


class Secret:
    """``Authorization: Bearer <secret>`` or ``x-api-key: <secret>``, checked in constant time.

    It is what the official clients send from their ``api_key`` (openai and
    anthropic: the latter in ``x-api-key``) or ``token`` (huggingface_hub).
    """

    def __init__(self, secret: str, front: Front) -> None:
        self._secret = secret.encode("utf-8")
        self._front = front

    def admits(self, scope: Scope) -> bool:
        bearer = api_key = None
        for name, value in scope["headers"]:
            if name == _AUTHORIZATION and bearer is None:
                scheme, _, token = value.strip().partition(b" ")
                bearer = token if scheme.lower() == b"bearer" else b""
            elif name == _API_KEY and api_key is None:
                api_key = value
        # Both compared, whichever was sent, so the time taken tells nothing either
        # (the secret is never empty: an absent header matches nothing).
        by_bearer = hmac.compare_digest((bearer or b"").strip(), self._secret)
        by_key = hmac.compare_digest((api_key or b"").strip(), self._secret)
        return by_bearer or by_key

    def refusal(
        self, path: str, family: Family | None = None
    ) -> tuple[bytes, list[tuple[bytes, bytes]]]:
        """The 401's body and headers, counted as an ``unauthorized`` error; the body
        in ``family``'s shape (by default the path's)."""
        self._front.governor.record_error(ErrorCode.UNAUTHORIZED)
        message = (
            "missing or wrong bearer token (Authorization: Bearer <secret>, or x-api-key: <secret>)"
        )
        body = dumps(route_error(path, ErrorCode.UNAUTHORIZED, message, 401, family))
        return body, [NO_RETRY, _BEARER_CHALLENGE]


class RequireSecret:
    """An ASGI app that answers 401 to a request without the secret, else runs ``app``.

    A class, not a function: starlette takes a function endpoint for a
    request handler.
    """

    def __init__(self, app: ASGIApp, secret: Secret) -> None:
        self.app = app
        self.secret = secret

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.secret.admits(scope):
            await self.app(scope, receive, send)
            return
        body, headers = self.secret.refusal(scope["path"])
        await send_json(send, 401, body, headers)


class Counted:
    """Counts answered requests by route and status, for ``/metrics`` and ``/stats``."""

    def __init__(self, app: ASGIApp, counts: Counter[tuple[str, str]]) -> None:
        self.app = app
        self.counts = counts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = "499"  # nginx's "client closed request": no response was started

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = getattr(scope.get("route"), "path_format", "unmatched")
            self.counts[(route, status)] += 1

"""``HttpConfig``: where and how the HTTP fronts listen.

A module of its own because both sides of the HTTP front read it: ``http``
(the front, light) and ``_http_app`` (the starlette app, imported only when
the front serves), which must not import each other both ways.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from typing import Literal

from yieldgate.protocol import DEFAULT_MAX_FRAME_BYTES
from yieldgate.server.quota import QuotaConfig

__all__ = ["HttpConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpConfig:
    """Where and how the HTTP fronts listen.

    ``model_name`` is what ``GET /v1/models`` lists. With a ``secret``, every
    route but ``GET /health`` requires ``Authorization: Bearer <secret>`` (or
    ``x-api-key: <secret>``); without one, bind loopback (the default) unless
    a proxy guards the port. With a ``quota``, the inference routes answer as a provider over its
    quota would (``yieldgate.server.quota``).
    """

    host: str = "127.0.0.1"
    """The address to bind (default: loopback)."""
    port: int = 8080
    """The port to bind; 0: any free one (``Server.urls`` says which)."""
    max_body_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """The largest request body accepted, in bytes (default: 1 MiB); larger ones get 413."""
    model_name: str = "yieldgate-sim"
    """The model ``GET /v1/models`` lists."""
    secret: str | None = None
    """The bearer token every route but ``GET /health`` requires; ``None``: no auth."""
    head_timeout_s: float = 10.0
    """Seconds for a request head to arrive whole, after the connection opens or the previous
    response ends; past them the connection closes."""
    body_timeout_s: float = 30.0
    """Seconds for a request body to arrive whole after its head; past them, 408."""
    write_timeout_s: float = 30.0
    """Seconds a peer may take no bytes of a response before its connection is closed and its
    work cancelled: a reader that stopped cannot hold a slot."""
    max_connections: int = 10_000
    """Connections beyond this many are closed as soon as they are accepted."""
    parser: Literal["auto", "httptools", "h11"] = "auto"
    """The request parser: ``"httptools"`` (C, in the server extra), ``"h11"`` (pure Python,
    about 2.5x fewer replies per second) or ``"auto"``: httptools when it is installed."""
    quota: QuotaConfig | None = None
    """A provider's quota to emulate on the inference routes (OpenAI's RPM and TPM, their
    headers and 429s; Anthropic's on the Messages route), checked before the Governor;
    ``None``: no quota."""

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"http port must be in [0, 65535], got {self.port}")
        if self.max_body_bytes < 64:
            raise ValueError("max_body_bytes must be at least 64")
        if not self.model_name:
            raise ValueError("model_name must not be empty")
        if self.secret is not None and not self.secret:
            raise ValueError("secret must not be empty (leave it unset for no auth)")
        for name in ("head_timeout_s", "body_timeout_s", "write_timeout_s"):
            value = getattr(self, name)
            if not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a positive number")
        if self.max_connections < 1:
            raise ValueError("http max_connections must be >= 1")
        if self.parser not in ("auto", "httptools", "h11"):
            raise ValueError(
                f"http parser must be 'auto', 'httptools' or 'h11', got {self.parser!r}"
            )
        if self.parser == "httptools" and importlib.util.find_spec("httptools") is None:
            raise ValueError("http parser 'httptools' is not installed (pip install httptools)")

    @property
    def resolved_parser(self) -> Literal["httptools", "h11"]:
        """The parser that serves: ``parser``, with "auto" resolved."""
        if self.parser == "auto":
            return "httptools" if importlib.util.find_spec("httptools") is not None else "h11"
        return self.parser

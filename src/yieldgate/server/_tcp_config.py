"""``TcpConfig``: where and how the TCP front listens.

A module of its own because both sides of the TCP front read it: ``tcp``
(``TcpFront``: listening, accepting, the books) and ``_tcp_serving`` (what it
does on each connection), which ``tcp`` imports and which must not import it
back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from yieldgate.protocol import DEFAULT_MAX_FRAME_BYTES

__all__ = ["TcpConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpConfig:
    """Where and how the TCP front listens."""

    host: str = "127.0.0.1"
    """The address to bind (default: loopback)."""
    port: int = 7070
    """The port to bind; 0: any free one (``Server.urls`` says which)."""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    """The longest frame read, in bytes (default: 1 MiB); longer ones get ``frame_too_large``."""
    secret: str | None = None
    """The shared secret every frame's ``auth`` must carry; ``None``: no auth."""
    idle_timeout_s: float = 300.0
    """Seconds a connection with nothing in flight may go without completing a frame before
    it is closed (idle clients, and slowloris lines that never end)."""
    max_connections: int = 10_000
    """Connections beyond this many are closed as soon as they are accepted."""
    write_timeout_s: float = 30.0
    """Seconds a peer may take no bytes of a pending reply before its connection is closed and
    its work cancelled: a reader that stopped cannot hold a slot."""

    def __post_init__(self) -> None:
        if not (self.idle_timeout_s > 0 and math.isfinite(self.idle_timeout_s)):
            raise ValueError("idle_timeout_s must be a positive number")
        if not (self.write_timeout_s > 0 and math.isfinite(self.write_timeout_s)):
            raise ValueError("write_timeout_s must be a positive number")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.max_frame_bytes < 64:
            raise ValueError("max_frame_bytes must be at least 64")
        if self.secret is not None and not self.secret:
            raise ValueError("secret must not be empty (leave it unset for no auth)")

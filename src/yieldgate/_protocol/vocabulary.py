"""The governed protocol's vocabulary: its version, its limits, and the
enumerations its frames spell (priorities, yield reasons, error codes)."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Final

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "MAX_DEADLINE_MS",
    "PRIORITY_BY_NAME",
    "PROTOCOL_VERSION",
    "ErrorCode",
    "Priority",
    "YieldReason",
    "parse_priority",
]

PROTOCOL_VERSION: Final = "1.1"
"""The version this module speaks; version-1 peers work with it."""
DEFAULT_MAX_FRAME_BYTES: Final = 1 << 20
"""The longest frame a server reads by default (1 MiB); longer ones get ``frame_too_large``."""


class Priority(StrEnum):
    """Submit priority. A higher priority may use slots reserved from lower ones."""

    HIGH = "high"
    """May use every slot, those reserved for it included."""
    NORMAL = "normal"
    """The default: may use slots reserved for normal work, not those for high."""
    LOW = "low"
    """Uses only unreserved slots; the first to be held back by a hint."""


class YieldReason(StrEnum):
    """Why a submit was not admitted."""

    SATURATED = "saturated"
    """No slot this priority may use was free."""
    SLO = "slo"
    """The admission hook rejected it early: it would have missed its objective."""
    COLD_START = "cold_start"
    """The backend is still warming up."""


class ErrorCode(StrEnum):
    """The protocol's error codes."""

    BAD_FRAME = "bad_frame"
    """Not UTF-8, not a JSON object, or a field of the wrong type or value."""
    FRAME_TOO_LARGE = "frame_too_large"
    """A line longer than ``max_frame_bytes``; the connection is closed."""
    INTEGRITY_MISMATCH = "integrity_mismatch"
    """The body's SHA-256 did not match ``sha256``: corrupted in transit, so resend."""
    UNKNOWN_OP = "unknown_op"
    """An ``op`` the server does not know (a version-1 server's answer to ``cancel``)."""
    DUPLICATE_ID = "duplicate_id"
    """A submit's ``id`` is already in flight on this connection."""
    UNAUTHORIZED = "unauthorized"
    """The server has a secret and the frame's ``auth`` did not match it."""
    BACKEND_ERROR = "backend_error"
    """The backend refused the ``params``, failed, or gave a result JSON cannot carry."""
    DEADLINE_EXCEEDED = "deadline_exceeded"
    """The submit's ``deadline_ms`` ran out before it finished."""
    SHUTTING_DOWN = "shutting_down"
    """The server is shutting down and admits nothing more."""
    CANCELLED = "cancelled"
    """The client cancelled the submit (v1.1)."""
    WRITE_TIMEOUT = "write_timeout"
    """A write to the client made no progress in time; the connection is closed (v1.1)."""

    @property
    def default_retryable(self) -> bool:
        """Whether sending the same request again can succeed, absent other knowledge.

        An integrity mismatch is corruption in transit, so a resend may pass;
        a server shutting down will be replaced or restarted. Everything else
        fails the same way twice, except ``backend_error``, whose reply says.
        """
        return self in (ErrorCode.INTEGRITY_MISMATCH, ErrorCode.SHUTTING_DOWN)


PRIORITY_BY_NAME: Final[Mapping[str, Priority]] = {p.value: p for p in Priority}
"""``"high"`` -> ``Priority.HIGH`` and so on: a lookup that cannot raise."""


def parse_priority(value: str) -> Priority | None:
    """A priority as a header spells it: ``High``, `` low `` and ``NORMAL`` all count;
    ``None`` for anything else. Frames, unlike headers, must use the lowercase names."""
    return PRIORITY_BY_NAME.get(value.strip().lower())


# JSON numbers beyond 2**53 lose precision in most peers; no budget is that long.
MAX_DEADLINE_MS: Final = 2**53 - 1
"""The largest ``deadline_ms`` a frame may carry (``2**53 - 1``)."""

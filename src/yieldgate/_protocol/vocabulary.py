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
DEFAULT_MAX_FRAME_BYTES: Final = 1 << 20


class Priority(StrEnum):
    """Submit priority. A higher priority may use slots reserved from lower ones."""

    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class YieldReason(StrEnum):
    """Why a submit was not admitted."""

    SATURATED = "saturated"
    SLO = "slo"
    COLD_START = "cold_start"


class ErrorCode(StrEnum):
    """The protocol's error codes."""

    BAD_FRAME = "bad_frame"
    FRAME_TOO_LARGE = "frame_too_large"
    INTEGRITY_MISMATCH = "integrity_mismatch"
    UNKNOWN_OP = "unknown_op"
    DUPLICATE_ID = "duplicate_id"
    UNAUTHORIZED = "unauthorized"
    BACKEND_ERROR = "backend_error"
    DEADLINE_EXCEEDED = "deadline_exceeded"
    SHUTTING_DOWN = "shutting_down"
    CANCELLED = "cancelled"
    WRITE_TIMEOUT = "write_timeout"

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

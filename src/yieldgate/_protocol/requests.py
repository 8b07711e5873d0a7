"""Request frames: their records, the server's validating decoder, and the
builders a client sends.

``decode_request`` turns one line into a ``SubmitRequest``, ``CancelRequest``
(v1.1), ``StatsRequest`` or ``PingRequest``, checking the shared secret (in
constant time) and a submit's SHA-256, and raises ``FrameError`` with the
protocol's error code for anything else. ``submit_frame`` and its siblings
build the frames (as dicts, for ``encode_frame``).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from yieldgate._exceptions import FrameError
from yieldgate._protocol.codec import is_utf8, load_object, sha256_hex
from yieldgate._protocol.vocabulary import MAX_DEADLINE_MS, PRIORITY_BY_NAME, ErrorCode, Priority

__all__ = [
    "CancelRequest",
    "PingRequest",
    "Request",
    "StatsRequest",
    "SubmitRequest",
    "cancel_frame",
    "decode_request",
    "ping_frame",
    "stats_frame",
    "submit_frame",
]

_OPS: Final = frozenset({"submit", "cancel", "stats", "ping"})
_HEX: Final = frozenset("0123456789abcdef")


# Request records are built for every frame the server reads, so they are plain
# slotted dataclasses (a frozen one costs twice as much to build). Treat them
# as read-only.


@dataclass(slots=True, kw_only=True)
class SubmitRequest:
    """A validated ``submit``: its body matched its ``sha256``."""

    id: str
    """The client's name for the request, unique among its submits in flight."""
    body: str
    """The work, as text (a prompt; for the simulated backend, any text)."""
    sha256: str
    """The SHA-256 of ``body`` encoded as UTF-8, in lowercase hex; checked on arrival."""
    priority: Priority = Priority.NORMAL
    """Which slots it may use (default: normal)."""
    deadline_ms: int | None = None
    """Milliseconds the client will wait; past them the server stops. ``None``: none."""
    stream: bool = False
    """Whether to send ``chunk`` replies before the terminal reply."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Backend parameters (the simulated backend's ``exec_ms``, ``chunks``...)."""


@dataclass(slots=True, kw_only=True)
class CancelRequest:
    """A ``cancel`` (v1.1): stop the submit with this ``id`` on the same connection."""

    id: str
    """The ``id`` of the submit to stop."""


@dataclass(slots=True, kw_only=True)
class StatsRequest:
    """A ``stats`` request."""

    id: str
    """The request's ``id``, which its reply carries."""


@dataclass(slots=True, kw_only=True)
class PingRequest:
    """A ``ping`` request."""

    id: str
    """The request's ``id``, which its reply carries."""


Request = SubmitRequest | CancelRequest | StatsRequest | PingRequest
"""Any request ``decode_request`` returns."""


def decode_request(line: bytes | str, *, secret: str | None = None) -> Request:
    """Decode and validate one request line (without its newline).

    Checks run in this order, and the first failure is raised as
    ``FrameError``: JSON object (``bad_frame``), ``auth`` when ``secret`` is
    set (``unauthorized``, compared in constant time), ``op``
    (``bad_frame`` / ``unknown_op``), ``id`` and the op's fields
    (``bad_frame``), and last the body's SHA-256 (``integrity_mismatch``).
    A frame's ``id`` is carried on the error whenever it was a string.
    """
    try:
        obj = load_object(line)
    except ValueError as exc:
        raise FrameError(ErrorCode.BAD_FRAME, str(exc)) from None

    raw_id = obj.get("id")
    rid = raw_id if isinstance(raw_id, str) and is_utf8(raw_id) else None

    if secret is not None:
        auth = obj.get("auth")
        if (
            not isinstance(auth, str)
            or not is_utf8(auth)
            or not hmac.compare_digest(auth.encode("utf-8"), secret.encode("utf-8"))
        ):
            raise FrameError(ErrorCode.UNAUTHORIZED, "missing or wrong auth", request_id=rid)

    op = obj.get("op")
    if not isinstance(op, str):
        raise FrameError(ErrorCode.BAD_FRAME, "'op' must be a string", request_id=rid)
    if op not in _OPS:
        raise FrameError(
            ErrorCode.UNKNOWN_OP,
            f"unknown op {op[:64]!r}; expected submit, cancel, stats or ping",
            request_id=rid,
        )
    if rid is None:
        raise FrameError(ErrorCode.BAD_FRAME, "'id' must be a string of valid Unicode")

    if op == "stats":
        return StatsRequest(id=rid)
    if op == "ping":
        return PingRequest(id=rid)
    if op == "cancel":
        return CancelRequest(id=rid)
    return _decode_submit(obj, rid)


def _bad(rid: str, message: str) -> FrameError:
    return FrameError(ErrorCode.BAD_FRAME, message, request_id=rid)


def _decode_submit(obj: dict[str, Any], rid: str) -> SubmitRequest:
    body = obj.get("body")
    if type(body) is not str:
        raise _bad(rid, "submit needs a string 'body'")
    try:
        body_bytes = body.encode("utf-8")
    except UnicodeEncodeError:
        raise _bad(rid, "'body' holds a lone surrogate escape, which UTF-8 cannot encode") from None
    digest = obj.get("sha256")
    if type(digest) is not str:
        raise _bad(rid, "submit needs 'sha256', the lowercase hex SHA-256 of 'body'")

    raw_priority = obj.get("priority")
    if raw_priority is None:
        priority = Priority.NORMAL
    else:
        found = PRIORITY_BY_NAME.get(raw_priority) if type(raw_priority) is str else None
        if found is None:
            raise _bad(rid, "'priority' must be 'high', 'normal' or 'low'")
        priority = found

    deadline_ms = obj.get("deadline_ms")
    if deadline_ms is not None:
        if type(deadline_ms) is not int:
            raise _bad(rid, "'deadline_ms' must be an integer number of milliseconds")
        if abs(deadline_ms) > MAX_DEADLINE_MS:
            raise _bad(rid, f"'deadline_ms' must be within +/-{MAX_DEADLINE_MS}")

    stream = obj.get("stream")
    if stream is None:
        stream = False
    elif type(stream) is not bool:
        raise _bad(rid, "'stream' must be a boolean")

    params = obj.get("params")
    if params is None:
        params = {}
    elif type(params) is not dict:
        raise _bad(rid, "'params' must be a JSON object")

    # Integrity last: the hash is the costliest check and meaningless on a malformed frame.
    # A digest equal to the real one is well-formed by construction, so its format
    # is only examined when they differ (to tell bad_frame from integrity_mismatch).
    if hashlib.sha256(body_bytes).hexdigest() != digest:
        if len(digest) != 64 or not _HEX.issuperset(digest):
            raise _bad(rid, "'sha256' must be 64 lowercase hex digits")
        raise FrameError(
            ErrorCode.INTEGRITY_MISMATCH,
            "body does not match its sha256 (corrupted in transit?)",
            request_id=rid,
        )
    return SubmitRequest(
        id=rid,
        body=body,
        sha256=digest,
        priority=priority,
        deadline_ms=deadline_ms,
        stream=stream,
        params=params,
    )


def submit_frame(
    request_id: str,
    body: str,
    *,
    priority: Priority | str = Priority.NORMAL,
    deadline_ms: int | None = None,
    stream: bool = False,
    params: Mapping[str, Any] | None = None,
    auth: str | None = None,
) -> dict[str, Any]:
    """Build a ``submit`` frame, computing its ``sha256``."""
    frame: dict[str, Any] = {
        "op": "submit",
        "id": request_id,
        "body": body,
        "sha256": sha256_hex(body),
    }
    if priority != Priority.NORMAL:
        frame["priority"] = str(Priority(priority))
    if deadline_ms is not None:
        frame["deadline_ms"] = int(deadline_ms)
    if stream:
        frame["stream"] = True
    if params:
        frame["params"] = dict(params)
    if auth is not None:
        frame["auth"] = auth
    return frame


def stats_frame(request_id: str, *, auth: str | None = None) -> dict[str, Any]:
    """Build a ``stats`` request frame."""
    frame: dict[str, Any] = {"op": "stats", "id": request_id}
    if auth is not None:
        frame["auth"] = auth
    return frame


def cancel_frame(request_id: str, *, auth: str | None = None) -> dict[str, Any]:
    """Build a ``cancel`` frame (v1.1) for the submit ``request_id`` on this connection."""
    frame: dict[str, Any] = {"op": "cancel", "id": request_id}
    if auth is not None:
        frame["auth"] = auth
    return frame


def ping_frame(request_id: str, *, auth: str | None = None) -> dict[str, Any]:
    """Build a ``ping`` request frame."""
    frame: dict[str, Any] = {"op": "ping", "id": request_id}
    if auth is not None:
        frame["auth"] = auth
    return frame

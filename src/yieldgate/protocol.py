"""The governed protocol, version 1.1: frames as they cross the wire.

One module shared by the reference server and the SDK's governed client. It
turns bytes into typed, validated frames and back, and nothing else: no I/O,
no clocks, only the standard library. ``docs/protocol.md`` is the user's guide;
``PROTOCOL.md`` in the shared design folder is the contract.

A frame is one JSON object in UTF-8 followed by ``\\n``. The decoders take one
line *without* its newline. Requests decode to ``SubmitRequest``,
``CancelRequest`` (v1.1), ``StatsRequest`` or ``PingRequest``; replies to
``OkReply``, ``YieldReply``, ``ErrorReply``, ``ChunkReply``, ``StatsReply`` or
``PongReply``. Anything that is not a valid frame raises ``FrameError``
(requests) or ``ProtocolError`` (replies), never a ``json`` or
``UnicodeDecodeError``. The protocol's errors live here: ``ProtocolError``
is their base (a ``yieldgate.YieldgateError``), ``FrameError`` a rejected
frame and ``IntegrityError`` a body that kept failing its SHA-256 check.

Unknown fields are ignored in both directions, so that a later version can add
fields without breaking version-1 peers. Version 1.1 adds the ``cancel`` op and
the ``cancelled`` and ``write_timeout`` error codes; a 1.1 client works with a
version-1 server (which answers ``cancel`` with ``unknown_op``, ignored).

The HTTP fronts and the HTTP transport share two headers, public here:
``PRIORITY_HEADER`` (read with ``parse_priority``, case-insensitively) and
``DEADLINE_HEADER`` (spelled once, with every other header name, in
``yieldgate._headers``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from json.encoder import encode_basestring
from typing import Any, Final

from yieldgate._exceptions import FrameError, IntegrityError, ProtocolError
from yieldgate._headers import DEADLINE_HEADER, PRIORITY_HEADER

__all__ = [
    "DEADLINE_HEADER",
    "DEFAULT_MAX_FRAME_BYTES",
    "MAX_DEADLINE_MS",
    "PRIORITY_BY_NAME",
    "PRIORITY_HEADER",
    "PROTOCOL_VERSION",
    "CancelRequest",
    "ChunkReply",
    "ErrorCode",
    "ErrorReply",
    "FrameError",
    "IntegrityError",
    "OkReply",
    "PingRequest",
    "PongReply",
    "Priority",
    "ProtocolError",
    "Reply",
    "Request",
    "StatsReply",
    "StatsRequest",
    "SubmitRequest",
    "YieldReason",
    "YieldReply",
    "cancel_frame",
    "chunk_frame",
    "decode_reply",
    "decode_request",
    "encode_frame",
    "encode_yield",
    "error_frame",
    "ok_frame",
    "parse_priority",
    "ping_frame",
    "pong_frame",
    "sha256_hex",
    "stats_frame",
    "stats_reply_frame",
    "submit_frame",
    "yield_frame",
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


_OPS: Final = frozenset({"submit", "cancel", "stats", "ping"})
PRIORITY_BY_NAME: Final[Mapping[str, Priority]] = {p.value: p for p in Priority}
"""``"high"`` -> ``Priority.HIGH`` and so on: a lookup that cannot raise."""


def parse_priority(value: str) -> Priority | None:
    """A priority as a header spells it: ``High``, `` low `` and ``NORMAL`` all count;
    ``None`` for anything else. Frames, unlike headers, must use the lowercase names."""
    return PRIORITY_BY_NAME.get(value.strip().lower())


_HEX: Final = frozenset("0123456789abcdef")
# JSON numbers beyond 2**53 lose precision in most peers; no budget is that long.
MAX_DEADLINE_MS: Final = 2**53 - 1


# -- requests -----------------------------------------------------------------


# Request records are built for every frame the server reads, so they are plain
# slotted dataclasses (a frozen one costs twice as much to build). Treat them
# as read-only.


@dataclass(slots=True, kw_only=True)
class SubmitRequest:
    """A validated ``submit``: its body matched its ``sha256``."""

    id: str
    body: str
    sha256: str
    priority: Priority = Priority.NORMAL
    deadline_ms: int | None = None
    stream: bool = False
    params: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True, kw_only=True)
class CancelRequest:
    """A ``cancel`` (v1.1): stop the submit with this ``id`` on the same connection."""

    id: str


@dataclass(slots=True, kw_only=True)
class StatsRequest:
    """A ``stats`` request."""

    id: str


@dataclass(slots=True, kw_only=True)
class PingRequest:
    """A ``ping`` request."""

    id: str


Request = SubmitRequest | CancelRequest | StatsRequest | PingRequest


def sha256_hex(body: str) -> str:
    """The lowercase hex SHA-256 of ``body`` encoded as UTF-8, as ``submit`` carries it."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def _reject_constant(name: str) -> Any:
    # JSON has no NaN or Infinity; Python's json accepts them unless told not to.
    raise ValueError(f"{name} is not valid JSON")


_YIELD_TEMPLATE: Final = (
    b'{"id":%s,"status":"yield","retry_hint_ms":%d,"inflight":%d,"max_inflight":%d,"reason":%s}\n'
)

# Built once: json.loads/dumps with options construct a new coder on every call.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _load_object(line: bytes | str) -> dict[str, Any]:
    """Parse one line into a JSON object or raise ``ValueError`` saying why."""
    if isinstance(line, str):
        text = line
    else:
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"frame is not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = _DECODER.decode(text)
    except RecursionError:
        raise ValueError("frame is nested too deeply") from None
    except ValueError as exc:
        raise ValueError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"frame must be a JSON object, not {_json_type(obj)}")  # noqa: TRY004
    return obj


def _json_type(value: object) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case _:
            return "an object"


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
        obj = _load_object(line)
    except ValueError as exc:
        raise FrameError(ErrorCode.BAD_FRAME, str(exc)) from None

    raw_id = obj.get("id")
    rid = raw_id if isinstance(raw_id, str) and _is_utf8(raw_id) else None

    if secret is not None:
        auth = obj.get("auth")
        if (
            not isinstance(auth, str)
            or not _is_utf8(auth)
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


def _is_utf8(text: str) -> bool:
    """False for strings JSON escapes can build but UTF-8 cannot carry (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


# -- encoding -----------------------------------------------------------------


def encode_frame(frame: Mapping[str, Any]) -> bytes:
    """Serialise one frame to its wire form, newline included.

    Raises ``ValueError`` or ``TypeError`` when the frame holds something JSON
    cannot carry (NaN, a set, an arbitrary object): callers that relay a
    backend's result must be ready for that.
    """
    return _ENCODER.encode(frame).encode("utf-8") + b"\n"


def encode_yield(
    request_id: str,
    *,
    retry_hint_ms: int,
    inflight: int,
    max_inflight: int,
    reason: YieldReason | str,
) -> bytes:
    """``encode_frame(yield_frame(...))``, built from a template: the saturated
    server's hottest path. The bytes are identical."""
    return _YIELD_TEMPLATE % (
        encode_basestring(request_id).encode("utf-8"),
        max(0, int(retry_hint_ms)),
        inflight,
        max_inflight,
        encode_basestring(str(reason)).encode("utf-8"),
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


def ok_frame(request_id: str, result: Any, exec_ms: float) -> dict[str, Any]:
    """The terminal reply of an admitted, executed submit."""
    return {"id": request_id, "status": "ok", "result": result, "exec_ms": round(exec_ms, 3)}


def yield_frame(
    request_id: str,
    *,
    retry_hint_ms: int,
    inflight: int,
    max_inflight: int,
    reason: YieldReason | str,
) -> dict[str, Any]:
    """The terminal reply of a submit that was not admitted."""
    return {
        "id": request_id,
        "status": "yield",
        "retry_hint_ms": max(0, int(retry_hint_ms)),
        "inflight": inflight,
        "max_inflight": max_inflight,
        "reason": str(reason),
    }


def error_frame(
    request_id: str | None,
    code: ErrorCode | str,
    message: str,
    *,
    retryable: bool | None = None,
) -> dict[str, Any]:
    """An ``error`` reply; ``retryable`` defaults to the code's usual meaning."""
    code = ErrorCode(code)
    return {
        "id": request_id,
        "status": "error",
        "code": str(code),
        "message": message,
        "retryable": code.default_retryable if retryable is None else retryable,
    }


def chunk_frame(request_id: str, seq: int, data: Any) -> dict[str, Any]:
    """One streamed piece of a submit's output, before its terminal reply."""
    return {"id": request_id, "status": "chunk", "seq": seq, "data": data}


def pong_frame(request_id: str) -> dict[str, Any]:
    """The reply to ``ping``."""
    return {"id": request_id, "status": "ok", "op": "pong"}


def stats_reply_frame(request_id: str, counters: Mapping[str, Any]) -> dict[str, Any]:
    """The reply to ``stats``: the counters, flattened beside ``id``, ``status`` and ``op``."""
    frame: dict[str, Any] = {"id": request_id, "status": "ok", "op": "stats"}
    frame.update(counters)
    return frame


# -- replies (the client's side) ----------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class OkReply:
    """``ok``: admitted and executed."""

    id: str
    result: Any
    exec_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class YieldReply:
    """``yield``: not admitted, nothing queued; come back in about ``retry_hint_ms``."""

    id: str
    retry_hint_ms: int
    inflight: int
    max_inflight: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply:
    """``error``: the request failed; ``retryable`` says whether a resend may succeed."""

    id: str | None
    code: str
    message: str
    retryable: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkReply:
    """``chunk``: one piece of a streamed result."""

    id: str
    seq: int
    data: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsReply:
    """The reply to ``stats``; ``counters`` holds every field but ``id``, ``status`` and ``op``."""

    id: str
    counters: Mapping[str, Any]

    @property
    def inflight(self) -> int:
        return int(self.counters["inflight"])

    @property
    def max_inflight(self) -> int:
        return int(self.counters["max_inflight"])


@dataclass(frozen=True, slots=True, kw_only=True)
class PongReply:
    """The reply to ``ping``."""

    id: str


Reply = OkReply | YieldReply | ErrorReply | ChunkReply | StatsReply | PongReply

_STATS_REQUIRED: Final = (
    "inflight",
    "max_inflight",
    "executed_total",
    "yielded_total",
    "errors_total",
)


def _field(obj: Mapping[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = obj.get(name)
    # bool is an int in Python but never a count or a hint on the wire.
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _as_tuple(kind)):
        raise ProtocolError(f"reply field {name!r} is missing or not {_kind_name(kind)}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    return " or ".join(k.__name__ for k in _as_tuple(kind))


def decode_reply(line: bytes | str) -> Reply:
    """Decode one reply line (without its newline); raise ``ProtocolError`` if invalid."""
    try:
        obj = _load_object(line)
    except ValueError as exc:
        raise ProtocolError(f"bad reply: {exc}") from None
    status = obj.get("status")
    if status == "error":
        rid = obj.get("id")
        if rid is not None and not isinstance(rid, str):
            raise ProtocolError("reply field 'id' must be a string or null")
        retryable = obj.get("retryable", False)
        return ErrorReply(
            id=rid,
            code=str(_field(obj, "code", str)),
            message=str(obj.get("message", "")),
            retryable=bool(retryable) if isinstance(retryable, bool) else False,
        )
    rid = _field(obj, "id", str)
    if status == "ok":
        op = obj.get("op")
        if op == "pong":
            return PongReply(id=rid)
        if op == "stats":
            for name in _STATS_REQUIRED:
                _field(obj, name, int)
            counters = {k: v for k, v in obj.items() if k not in ("id", "status", "op")}
            return StatsReply(id=rid, counters=counters)
        if "result" not in obj:
            raise ProtocolError("ok reply without 'result'")
        exec_ms = _field(obj, "exec_ms", (int, float))
        try:
            exec_ms = float(exec_ms)
        except OverflowError:
            raise ProtocolError("reply field 'exec_ms' is out of range") from None
        if not math.isfinite(exec_ms):
            raise ProtocolError("reply field 'exec_ms' must be finite")
        return OkReply(id=rid, result=obj["result"], exec_ms=exec_ms)
    if status == "yield":
        hint = _field(obj, "retry_hint_ms", int)
        if hint < 0:
            raise ProtocolError("reply field 'retry_hint_ms' must be >= 0")
        return YieldReply(
            id=rid,
            retry_hint_ms=hint,
            inflight=_field(obj, "inflight", int),
            max_inflight=_field(obj, "max_inflight", int),
            reason=str(_field(obj, "reason", str)),
        )
    if status == "chunk":
        seq = _field(obj, "seq", int)
        if seq < 0:
            raise ProtocolError("reply field 'seq' must be >= 0")
        return ChunkReply(id=rid, seq=seq, data=obj.get("data"))
    raise ProtocolError(f"unknown reply status {str(status)[:64]!r}")

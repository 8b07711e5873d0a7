"""Reply frames: the builders a server sends, their records, and the client's
decoder.

``ok_frame``, ``yield_frame``, ``error_frame``, ``chunk_frame``,
``pong_frame`` and ``stats_reply_frame`` build replies (as dicts, for
``encode_frame``); ``encode_yield`` writes a ``yield`` straight to bytes, the
saturated server's hottest path. ``decode_reply`` turns one line into an
``OkReply``, ``YieldReply``, ``ErrorReply``, ``ChunkReply``, ``StatsReply``
or ``PongReply``, and raises ``ProtocolError`` for anything else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any, Final

from yieldgate._exceptions import ProtocolError
from yieldgate._protocol.codec import load_object
from yieldgate._protocol.vocabulary import ErrorCode, YieldReason

__all__ = [
    "ChunkReply",
    "ErrorReply",
    "OkReply",
    "PongReply",
    "Reply",
    "StatsReply",
    "YieldReply",
    "chunk_frame",
    "decode_reply",
    "encode_yield",
    "error_frame",
    "ok_frame",
    "pong_frame",
    "stats_reply_frame",
    "yield_frame",
]

_YIELD_TEMPLATE: Final = (
    b'{"id":%s,"status":"yield","retry_hint_ms":%d,"inflight":%d,"max_inflight":%d,"reason":%s}\n'
)


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


@dataclass(frozen=True, slots=True, kw_only=True)
class OkReply:
    """``ok``: admitted and executed."""

    id: str
    """The submit's ``id``."""
    result: Any
    """What the backend returned (any JSON)."""
    exec_ms: float
    """Milliseconds from admission to the end of execution."""


@dataclass(frozen=True, slots=True, kw_only=True)
class YieldReply:
    """``yield``: not admitted, nothing queued; come back in about ``retry_hint_ms``."""

    id: str
    """The submit's ``id``."""
    retry_hint_ms: int
    """When to come back, in milliseconds (an integer, at least 0)."""
    inflight: int
    """Submits executing on the whole server when it decided."""
    max_inflight: int
    """The slots in force then: the cap, or less during a capacity ramp."""
    reason: str
    """Why: ``saturated``, ``cold_start`` or ``slo`` (a ``YieldReason`` value)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply:
    """``error``: the request failed; ``retryable`` says whether a resend may succeed."""

    id: str | None
    """The request's ``id``; ``None`` when the frame had none that could be read."""
    code: str
    """An ``ErrorCode`` value (``bad_frame``, ``backend_error``...)."""
    message: str
    """For people to read; never parse it."""
    retryable: bool
    """Whether sending the same request again may succeed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ChunkReply:
    """``chunk``: one piece of a streamed result."""

    id: str
    """The submit's ``id``."""
    seq: int
    """The chunk's place in the stream: 0, 1, 2..."""
    data: Any
    """The piece of output (any JSON)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StatsReply:
    """The reply to ``stats``; ``counters`` holds every field but ``id``, ``status`` and ``op``."""

    id: str
    """The ``stats`` request's ``id``."""
    counters: Mapping[str, Any]
    """The server's counters (docs/protocol.md lists them), by name."""

    @property
    def inflight(self) -> int:
        """Submits executing now, on all connections."""
        return int(self.counters["inflight"])

    @property
    def max_inflight(self) -> int:
        """The configured cap on submits executing at once."""
        return int(self.counters["max_inflight"])


@dataclass(frozen=True, slots=True, kw_only=True)
class PongReply:
    """The reply to ``ping``."""

    id: str
    """The ``ping`` request's ``id``."""


Reply = OkReply | YieldReply | ErrorReply | ChunkReply | StatsReply | PongReply
"""Any reply ``decode_reply`` returns."""

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
        obj = load_object(line)
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

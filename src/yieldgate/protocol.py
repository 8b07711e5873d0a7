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

# The pieces live in yieldgate._protocol, one concern a module; this module is
# their one public face.
from yieldgate._exceptions import FrameError, IntegrityError, ProtocolError
from yieldgate._headers import DEADLINE_HEADER, PRIORITY_HEADER
from yieldgate._protocol.codec import encode_frame, sha256_hex
from yieldgate._protocol.replies import (
    ChunkReply,
    ErrorReply,
    OkReply,
    PongReply,
    Reply,
    StatsReply,
    YieldReply,
    chunk_frame,
    decode_reply,
    encode_yield,
    error_frame,
    ok_frame,
    pong_frame,
    stats_reply_frame,
    yield_frame,
)
from yieldgate._protocol.requests import (
    CancelRequest,
    PingRequest,
    Request,
    StatsRequest,
    SubmitRequest,
    cancel_frame,
    decode_request,
    ping_frame,
    stats_frame,
    submit_frame,
)
from yieldgate._protocol.vocabulary import (
    DEFAULT_MAX_FRAME_BYTES,
    MAX_DEADLINE_MS,
    PRIORITY_BY_NAME,
    PROTOCOL_VERSION,
    ErrorCode,
    Priority,
    YieldReason,
    parse_priority,
)

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

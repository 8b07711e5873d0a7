"""A fast path for the server's commonest frame: a well-formed ``submit``.

``yieldgate.protocol.decode_request`` is the reference: stdlib only, exact
error codes and messages. Under load most of its cost is the Python objects it
builds (a dict, its strings, then the checks over them). msgspec (from the
``server`` extra) decodes straight into a typed struct in C instead.

The fast path only ever *accepts*: it returns a ``SubmitRequest`` for a submit
that passes every check ``decode_request`` makes (auth, types, priority,
deadline range, integrity), and ``None`` for anything else, which then goes
through ``decode_request`` to get its precise reply. So it changes nothing a
client can see. A property test holds it to that.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any

from yieldgate.protocol import MAX_DEADLINE_MS, PRIORITY_BY_NAME, Priority, SubmitRequest

__all__ = ["FastDecode", "fast_submit_decoder"]

FastDecode = Callable[[bytes], SubmitRequest | None]


def fast_submit_decoder(secret: str | None) -> FastDecode | None:
    """A decoder for well-formed submits, or ``None`` when msgspec is not installed."""
    try:
        import msgspec
    except ImportError:
        return None

    class _Submit(msgspec.Struct):
        op: str
        id: str
        body: str | None = None
        sha256: str | None = None
        priority: str | None = None
        deadline_ms: int | None = None
        stream: bool | None = None
        params: dict[str, Any] | None = None
        auth: str | None = None

    decode = msgspec.json.Decoder(_Submit).decode
    errors = (msgspec.DecodeError, msgspec.ValidationError)
    secret_bytes = None if secret is None else secret.encode("utf-8")

    def fast(line: bytes) -> SubmitRequest | None:
        try:
            frame = decode(line)
        except (*errors, RecursionError):
            return None  # the reference decoder gives the precise reply
        body = frame.body
        digest = frame.sha256
        if frame.op != "submit" or body is None or digest is None:
            return None
        if secret_bytes is not None and (
            frame.auth is None or not hmac.compare_digest(frame.auth.encode("utf-8"), secret_bytes)
        ):
            return None
        if frame.priority is None:
            priority = Priority.NORMAL
        else:
            found = PRIORITY_BY_NAME.get(frame.priority)
            if found is None:
                return None
            priority = found
        deadline_ms = frame.deadline_ms
        if deadline_ms is not None and abs(deadline_ms) > MAX_DEADLINE_MS:
            return None
        if hashlib.sha256(body.encode("utf-8")).hexdigest() != digest:
            return None
        return SubmitRequest(
            id=frame.id,
            body=body,
            sha256=digest,
            priority=priority,
            deadline_ms=deadline_ms,
            stream=bool(frame.stream),
            params={} if frame.params is None else frame.params,
        )

    return fast

"""A fast path for the server's commonest frame: a well-formed ``submit``.

``yieldgate.protocol.decode_request`` is the reference: stdlib only, exact
error codes and messages. Under load most of its cost is the Python objects it
builds (a dict, its strings, then the checks over them). msgspec (from the
``server`` extra) decodes straight into a typed struct in C instead, and
checks ``op``, the field types and the priority name as it goes.

The fast path only ever *accepts*: it returns a ``FastSubmit`` for a submit
that passes every check ``decode_request`` makes (auth, types, priority,
deadline range, integrity), and ``None`` for anything else, which then goes
through ``decode_request`` to get its precise reply. So it changes nothing a
client can see. A property test holds it to that.

A ``FastSubmit`` is the decoded struct itself, not a ``SubmitRequest``: a
saturated server refuses most submits, and a refusal needs only the id and
the priority. ``FastSubmit.request()`` builds the ``SubmitRequest`` for work
that is admitted.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from typing import Any, Literal, Protocol

from yieldgate.protocol import MAX_DEADLINE_MS, Priority, SubmitRequest

__all__ = ["FastDecode", "FastSubmit", "fast_submit_decoder"]


class FastSubmit(Protocol):
    """A submit that passed every check of ``decode_request``, integrity included.

    Optional fields are ``None`` when the frame left them out (or sent
    ``null``): ``priority`` then means normal, ``stream`` false and
    ``params`` empty.
    """

    id: str
    body: str
    sha256: str
    priority: Priority | None
    deadline_ms: int | None
    stream: bool | None
    params: dict[str, Any] | None

    def request(self) -> SubmitRequest:
        """The ``SubmitRequest`` ``decode_request`` returns for the same line."""
        ...


FastDecode = Callable[[bytes], FastSubmit | None]


def fast_submit_decoder(secret: str | None) -> FastDecode | None:
    """A decoder for well-formed submits, or ``None`` when msgspec is not installed."""
    try:
        import msgspec
    except ImportError:
        return None

    # Not tracked by the cycle collector: a decoded frame cannot refer to itself.
    # Unknown fields send the frame to the reference decoder: msgspec skips them
    # without checking their bytes, and the reference refuses invalid UTF-8 anywhere.
    class _Submit(msgspec.Struct, gc=False, forbid_unknown_fields=True):
        op: Literal["submit"]
        id: str
        body: str
        sha256: str
        priority: Priority | None = None
        deadline_ms: int | None = None
        stream: bool | None = None
        params: dict[str, Any] | None = None
        auth: str | None = None

        def request(self) -> SubmitRequest:
            return SubmitRequest(
                id=self.id,
                body=self.body,
                sha256=self.sha256,
                priority=Priority.NORMAL if self.priority is None else self.priority,
                deadline_ms=self.deadline_ms,
                stream=bool(self.stream),
                params={} if self.params is None else self.params,
            )

    decode = msgspec.json.Decoder(_Submit).decode
    errors = (msgspec.DecodeError, msgspec.ValidationError, RecursionError, UnicodeDecodeError)
    sha256 = hashlib.sha256
    secret_bytes = None if secret is None else secret.encode("utf-8")

    def fast(line: bytes) -> FastSubmit | None:
        try:
            frame = decode(line)
        except errors:
            return None  # the reference decoder gives the precise reply
        if secret_bytes is not None and (
            frame.auth is None or not hmac.compare_digest(frame.auth.encode("utf-8"), secret_bytes)
        ):
            return None
        deadline_ms = frame.deadline_ms
        if deadline_ms is not None and abs(deadline_ms) > MAX_DEADLINE_MS:
            return None
        if sha256(frame.body.encode("utf-8")).hexdigest() != frame.sha256:
            return None
        return frame

    return fast

"""The exception tree of yieldgate.

Every error yieldgate raises to its users is a ``YieldgateError``; no
dependency's exception type escapes the public API::

    YieldgateError
     └── ProtocolError          a peer broke the governed protocol (PROTOCOL.md)
          └── FrameError        one frame could not be decoded or failed validation

This module imports only the standard library, so that the protocol module
(shared by the server and the client) can raise these types.
"""

from __future__ import annotations

__all__ = ["FrameError", "ProtocolError", "YieldgateError"]


class YieldgateError(Exception):
    """Base class of every error that yieldgate raises."""


class ProtocolError(YieldgateError):
    """A peer sent something the governed protocol does not allow."""


class FrameError(ProtocolError):
    """One frame was rejected.

    ``code`` is the protocol's error code (``bad_frame``, ``frame_too_large``,
    ``integrity_mismatch``, ``unknown_op``, ``unauthorized``) and
    ``request_id`` the frame's ``id`` when one could be read, else ``None``.
    """

    def __init__(self, code: str, message: str, *, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"FrameError(code={self.code!r}, message={self.message!r}, id={self.request_id!r})"

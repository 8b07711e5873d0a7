"""Per-token log-probabilities, as a backend reports them and as the dialects read them.

A backend that honours ``params["logprobs"]`` (its ``features`` say so: the
harness) puts ``"logprobs"`` in its result and its stream chunks: one entry
per generated token, ``{"id": int, "logprob": float, "top": [{"id": int,
"logprob": float}, ...]}`` with the most likely alternatives first. The ids
are bytes (a byte-level vocabulary: an id is its byte's value), which is
what a token's text and ``bytes`` are made from. ``read_logprobs`` checks
them into ``TokenLogprob`` records; a malformed entry is the backend's fault
(``BackendError``). A log-probability that is not finite (an underflow)
reads as ``-9999.0``, OpenAI's value for "very unlikely": JSON has no
``-Infinity``.

``token_text`` is how a token shows as text: the character where a byte is
one (ASCII), else ``"bytes:\\xNN"``, OpenAI's spelling for a token that is
not whole UTF-8.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from yieldgate.server.backends import BackendError

__all__ = ["UNLIKELY", "TokenLogprob", "read_logprobs", "token_text"]

UNLIKELY = -9999.0


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """One generated token's log-probability and its ``top`` alternatives, ``(id, logprob)``."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_text(token_id: int) -> str:
    """A byte token's text: its character if ASCII, else OpenAI's ``bytes:\\xNN`` spelling."""
    return chr(token_id) if token_id < 0x80 else f"bytes:\\x{token_id:02x}"


def read_logprobs(data: Any) -> tuple[TokenLogprob, ...] | None:
    """``data["logprobs"]`` of a backend result or chunk, or ``None`` where it has none."""
    if not isinstance(data, Mapping) or data.get("logprobs") is None:
        return None
    entries = data["logprobs"]
    if not isinstance(entries, list):
        raise BackendError("backend 'logprobs' is not an array", retryable=False)
    return tuple(_entry(entry) for entry in entries)


def _entry(entry: Any) -> TokenLogprob:
    if not isinstance(entry, Mapping):
        raise BackendError("backend 'logprobs' entry is not an object", retryable=False)
    top = entry.get("top", [])
    if not isinstance(top, list):
        raise BackendError("backend 'logprobs' entry's 'top' is not an array", retryable=False)
    alternatives = []
    for alternative in top:
        if not isinstance(alternative, Mapping):
            raise BackendError("backend 'logprobs' alternative is not an object", retryable=False)
        alternatives.append(_pair(alternative))
    token_id, logprob = _pair(entry)
    return TokenLogprob(token_id, logprob, tuple(alternatives))


def _pair(entry: Mapping[str, Any]) -> tuple[int, float]:
    token_id, logprob = entry.get("id"), entry.get("logprob")
    if type(token_id) is not int or not 0 <= token_id <= 0xFF:
        raise BackendError("backend 'logprobs' id is not a byte (0..255)", retryable=False)
    if isinstance(logprob, bool) or not isinstance(logprob, int | float):
        raise BackendError("backend 'logprobs' logprob is not a number", retryable=False)
    return token_id, float(logprob) if math.isfinite(logprob) else UNLIKELY

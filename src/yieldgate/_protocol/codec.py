"""One frame as bytes: the JSON line it travels as, and the body's SHA-256.

A frame is one JSON object in UTF-8 followed by ``\\n``. ``load_object``
parses a line (without its newline) into a dict or raises ``ValueError``
saying why; ``encode_frame`` is the way back. Both refuse what JSON has no
spelling for (NaN, Infinity). The request and reply decoders build on them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["encode_frame", "is_utf8", "load_object", "sha256_hex"]


def sha256_hex(body: str) -> str:
    """The lowercase hex SHA-256 of ``body`` encoded as UTF-8, as ``submit`` carries it."""
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


def _reject_constant(name: str) -> Any:
    # JSON has no NaN or Infinity; Python's json accepts them unless told not to.
    raise ValueError(f"{name} is not valid JSON")


# Built once: json.loads/dumps with options construct a new coder on every call.
_DECODER: Final = json.JSONDecoder(parse_constant=_reject_constant)
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def load_object(line: bytes | str) -> dict[str, Any]:
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


def is_utf8(text: str) -> bool:
    """False for strings JSON escapes can build but UTF-8 cannot carry (lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_frame(frame: Mapping[str, Any]) -> bytes:
    """Serialise one frame to its wire form, newline included.

    Raises ``ValueError`` or ``TypeError`` when the frame holds something JSON
    cannot carry (NaN, a set, an arbitrary object): callers that relay a
    backend's result must be ready for that.
    """
    return _ENCODER.encode(frame).encode("utf-8") + b"\n"

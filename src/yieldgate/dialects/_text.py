"""Getting the generated text out of a HuggingFace Inference API body.

Text-generation models answer ``[{"generated_text": ...}]``; TGI answers a
bare object; summarisation and translation models use ``summary_text`` and
``translation_text``; some pipelines nest the list once more; an
OpenAI-compatible route answers ``choices``. ``huggingface_text`` accepts all
of these and raises ``ResponseFormatError`` for anything else, an error
object included, instead of a ``KeyError`` deep in user code.
"""

from __future__ import annotations

import json
from typing import Any

from yieldgate._exceptions import ResponseFormatError

__all__ = ["huggingface_text"]

_TEXT_KEYS = ("generated_text", "summary_text", "translation_text", "text")
_MAX_DEPTH = 4


def _excerpt(value: Any) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text[:200]


def huggingface_text(body: bytes | str | Any) -> str:
    """The first generated text in ``body`` (raw bytes, JSON text, or decoded JSON).

    Raises ``ResponseFormatError`` when the body is not JSON, is an error
    object, or holds no text where any known shape puts it.
    """
    payload: Any = body
    if isinstance(body, bytes | bytearray):
        try:
            payload = body.decode("utf-8")
        except UnicodeDecodeError:
            raise ResponseFormatError(
                "response body is not UTF-8", excerpt=_excerpt(bytes(body))
            ) from None
    if isinstance(payload, str):
        try:
            payload = json.loads(payload)
        except ValueError:
            raise ResponseFormatError(
                "response body is not JSON", excerpt=_excerpt(payload)
            ) from None
    text = _find(payload, 0)
    if text is None:
        raise ResponseFormatError(
            "response body holds no generated text in any known shape", excerpt=_excerpt(payload)
        )
    return text


def _find(value: Any, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return _find(value[0], depth + 1) if value else None
    if not isinstance(value, dict):
        return None
    if "error" in value and not any(key in value for key in _TEXT_KEYS):
        raise ResponseFormatError(
            f"response body is an error: {_excerpt(value['error'])}", excerpt=_excerpt(value)
        )
    for key in _TEXT_KEYS:
        text = value.get(key)
        if isinstance(text, str):
            return text
    choices = value.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        first = choices[0]
        message = first.get("message")
        if isinstance(message, dict) and isinstance(message.get("content"), str):
            return str(message["content"])
        if isinstance(first.get("text"), str):
            return str(first["text"])
    return None

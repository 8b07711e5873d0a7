"""Trace replay: a JSONL file of arrivals, each with its own size.

One JSON object a line: ``offset_s`` (seconds from the start of the run,
required), at most one of ``prompt`` (the text) and ``prompt_chars`` (a
length; the tool writes a prompt that long), and ``max_tokens`` (optional).
Blank lines are skipped; anything else is an error naming the file and line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TraceEntry", "load_trace"]

_KEYS = frozenset({"offset_s", "prompt", "prompt_chars", "max_tokens"})


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceEntry:
    """One request of a trace."""

    offset_s: float
    prompt: str | None = None
    prompt_chars: int | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.offset_s) and self.offset_s >= 0):
            raise ValueError(f"offset_s must be a finite number >= 0, got {self.offset_s!r}")
        if self.prompt is not None and self.prompt_chars is not None:
            raise ValueError("give prompt or prompt_chars, not both")
        if self.prompt_chars is not None and self.prompt_chars < 1:
            raise ValueError(f"prompt_chars must be >= 1, got {self.prompt_chars}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


def _expect(ok: bool, message: str) -> None:
    # A file's content, not an argument's type: ValueError, as for every other bad value.
    if not ok:
        raise ValueError(message)


def _int(value: Any, name: str) -> int | None:
    if value is None:
        return None
    _expect(isinstance(value, int) and not isinstance(value, bool), f"{name} must be an integer")
    return int(value)


def _entry(obj: Any) -> TraceEntry:
    _expect(isinstance(obj, dict), "each line must be a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r} (use {', '.join(sorted(_KEYS))})")
    offset = obj.get("offset_s")
    _expect(
        isinstance(offset, int | float) and not isinstance(offset, bool),
        f"offset_s must be a number, got {offset!r}",
    )
    prompt = obj.get("prompt")
    _expect(prompt is None or isinstance(prompt, str), "prompt must be a string")
    return TraceEntry(
        offset_s=float(offset),
        prompt=prompt,
        prompt_chars=_int(obj.get("prompt_chars"), "prompt_chars"),
        max_tokens=_int(obj.get("max_tokens"), "max_tokens"),
    )


def load_trace(path: str | Path) -> tuple[TraceEntry, ...]:
    """The entries of a trace file, sorted by ``offset_s`` (stably: ties keep file order)."""
    where = Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"trace {str(where)!r}: cannot read it ({exc.strerror})") from exc
    entries: list[TraceEntry] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entries.append(_entry(json.loads(line)))
        except json.JSONDecodeError as exc:
            raise ValueError(f"trace {str(where)!r} line {number}: not JSON ({exc.msg})") from exc
        except ValueError as exc:
            raise ValueError(f"trace {str(where)!r} line {number}: {exc}") from exc
    if not entries:
        raise ValueError(f"trace {str(where)!r} has no entries")
    return tuple(sorted(entries, key=lambda e: e.offset_s))

"""Server-side series for the timeline: a Prometheus endpoint scraped, a process's memory.

``parse_exposition(text)`` reads the Prometheus text format (version 0.0.4,
what yieldgate, vLLM, TGI and SGLang serve; OpenMetrics' ``# EOF`` is
accepted) into ``{name: [(labels, value), ...]}``, with the standard library
only, so scraping needs no dependency. ``common_series`` maps the names each
server uses onto three series:

- queue: ``yieldgate_queued``, vLLM's ``vllm:num_requests_waiting``, TGI's
  ``tgi_queue_size``, SGLang's ``sglang:num_queue_reqs``;
- running: ``yieldgate_inflight``, ``vllm:num_requests_running``,
  ``tgi_batch_current_size``, ``sglang:num_running_reqs``;
- kv_cache: ``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` in
  older vLLM), ``sglang:token_usage``; yieldgate and TGI export none.

A name present under several label sets (vLLM labels by ``model_name`` and
engine) is summed; a KV-cache use is a fraction (vLLM's ``_perc`` gauges are
0 to 1 despite the name) and is averaged instead. ``process_rss_bytes(pid)``
is the resident memory of a process and its descendants, from ``/proc``
(``None`` elsewhere).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SERIES_NAMES",
    "ScrapedSeries",
    "common_series",
    "parse_exposition",
    "process_rss_bytes",
]

Samples = dict[str, list[tuple[dict[str, str], float]]]

#: Per common series, the metric names that feed it, first found wins.
SERIES_NAMES: Mapping[str, tuple[str, ...]] = {
    "queue": (
        "yieldgate_queued",
        "vllm:num_requests_waiting",
        "tgi_queue_size",
        "sglang:num_queue_reqs",
    ),
    "running": (
        "yieldgate_inflight",
        "vllm:num_requests_running",
        "tgi_batch_current_size",
        "sglang:num_running_reqs",
    ),
    "kv_cache": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
    ),
}
_AVERAGED = frozenset({"kv_cache"})

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_LINE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(rf'\s*({_NAME})\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _value(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    return float(text)


def _labels(text: str, line: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    at = 0
    while at < len(text):
        if not text[at:].strip():
            break
        match = _LABEL.match(text, at)
        if match is None:
            raise ValueError(f"bad labels in exposition line {line!r}")
        value = re.sub(r"\\.", lambda m: _ESCAPES.get(m.group(0), m.group(0)), match.group(2))
        labels[match.group(1)] = value
        at = match.end()
    return labels


def parse_exposition(text: str) -> Samples:
    """Prometheus text format into ``{name: [(labels, value), ...]}``, in file order.

    Comments (``# HELP``, ``# TYPE``, ``# EOF``) and blank lines are skipped;
    a line that is neither is a ``ValueError`` naming it.
    """
    out: Samples = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(f"not a Prometheus sample line: {line!r}")
        name, labels, value = match.groups()
        try:
            number = _value(value)
        except ValueError:
            raise ValueError(f"bad value in exposition line {line!r}") from None
        out.setdefault(name, []).append((_labels(labels or "", line), number))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapedSeries:
    """The common series read from one scrape (``None``: the server has no such metric)."""

    queue: float | None = None
    running: float | None = None
    kv_cache: float | None = None
    sources: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"queue": self.queue, "running": self.running, "kv_cache": self.kv_cache}


def common_series(samples: Samples) -> ScrapedSeries:
    """Queue length, running requests and KV-cache use from whichever names are present."""
    found: dict[str, float | None] = {}
    sources: list[str] = []
    for series, names in SERIES_NAMES.items():
        found[series] = None
        for name in names:
            values = [v for _, v in samples.get(name, ()) if math.isfinite(v)]
            if not values:
                continue
            total = sum(values)
            found[series] = total / len(values) if series in _AVERAGED else total
            sources.append(name)
            break
    return ScrapedSeries(
        queue=found["queue"],
        running=found["running"],
        kv_cache=found["kv_cache"],
        sources=tuple(sources),
    )


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as f:
                out.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue
    return out


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def process_rss_bytes(pid: int, *, tree: bool = True) -> int | None:
    """Resident memory of ``pid`` (and, with ``tree``, of all its descendants), in bytes;
    ``None`` when ``/proc`` cannot tell (not Linux, or the process is gone)."""
    own = _rss(pid)
    if own is None:
        return None
    total = own
    if tree:
        seen = {pid}
        todo: Sequence[int] = _children(pid)
        while todo:
            nxt: list[int] = []
            for child in todo:
                if child in seen:
                    continue
                seen.add(child)
                total += _rss(child) or 0
                nxt.extend(_children(child))
            todo = nxt
    return total

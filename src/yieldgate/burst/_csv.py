"""The results as CSV: one row per strategy per point (one point for a single burst).

``CSV_COLUMNS`` is the header, in order; docs/burst.md defines each column.
Latencies are milliseconds; an empty cell is a figure the run could not have
(streaming metrics without ``--stream``, a sweep value outside a sweep).
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from yieldgate.burst._results import BurstReport, Percentiles, StrategyResult
from yieldgate.burst._sweep import SweepReport

__all__ = ["CSV_COLUMNS", "csv_rows", "write_csv"]

_QUANTILES = ("p50", "p95", "p99")
_LATENCIES = ("e2e_ms", "ttft_ms", "tpot_ms", "itl_ms")
_PRIORITIES = ("high", "normal", "low")

CSV_COLUMNS: tuple[str, ...] = (
    "axis",
    "value",
    "profile",
    "concurrency",
    "strategy",
    "label",
    "requests",
    "succeeded",
    "success_rate",
    "attempts",
    "attempts_per_request",
    "yields",
    "http_429",
    "errors_by_kind",
    "server_yielded_by_reason",
    "makespan_s",
    "window_s",
    "throughput_per_s",
    "output_tokens",
    "tokens_per_s",
    *(f"{name}_{q}" for name in _LATENCIES for q in _QUANTILES),
    "goodput_ratio",
    "goodput_per_s",
    # Issue 21, items 3 to 5: appended, so the columns above keep their places.
    "timeouts",
    "hint_count",
    "hint_error_ms_p50",
    "hint_error_ms_p90",
    "hint_within",
    "recovery_yields_s",
    "recovery_latency_s",
    "recovery_s",
    *(
        f"priority_{name}_{figure}"
        for name in _PRIORITIES
        for figure in ("requests", "success_rate", "e2e_ms_p99", "jain")
    ),
    "scraped_queue_peak",
    "scraped_running_peak",
    "scraped_kv_cache_peak",
    "server_rss_peak_mb",
    "unreachable",
    # Issue 41: 0 for a strategy whose run was cut short (Ctrl-C, a dead server).
    "complete",
)
"""The CSV header, in order (``write_csv``); docs/burst.md defines each column."""


def _counts(counts: Mapping[str, int]) -> str:
    return ";".join(f"{k}={v}" for k, v in sorted(counts.items()))


def _row(
    axis: str | None, value: float | None, config: Mapping[str, Any], r: StrategyResult
) -> dict[str, Any]:
    latency: dict[str, Percentiles | None] = {
        "e2e_ms": Percentiles(
            count=r.latency_s.count,
            p50=None if r.latency_s.p50 is None else r.latency_s.p50 * 1000,
            p95=None if r.latency_s.p95 is None else r.latency_s.p95 * 1000,
            p99=None if r.latency_s.p99 is None else r.latency_s.p99 * 1000,
        ),
        **{k: (r.streaming or {}).get(k) for k in ("ttft_ms", "tpot_ms", "itl_ms")},
    }
    row: dict[str, Any] = {
        "axis": axis or "",
        "value": "" if value is None else f"{value:g}",
        "profile": config.get("profile", {}).get("spec", ""),
        "concurrency": config.get("concurrency") or "",
        "strategy": r.strategy,
        "label": r.label,
        "requests": r.requests,
        "succeeded": r.succeeded,
        "success_rate": r.success_rate,
        "attempts": r.attempts,
        "attempts_per_request": r.attempts_per_request,
        "yields": r.yields,
        "http_429": r.errors_by_kind.get("HTTP 429", 0),
        "errors_by_kind": _counts(r.errors_by_kind),
        "server_yielded_by_reason": "" if r.server is None else _counts(r.server.yielded_by_reason),
        "makespan_s": r.makespan_s,
        "window_s": r.window_s,
        "throughput_per_s": r.throughput_per_s,
        "output_tokens": "" if r.output_tokens is None else r.output_tokens,
        "tokens_per_s": "" if r.tokens_per_s is None else r.tokens_per_s,
        "goodput_ratio": r.goodput_ratio,
        "goodput_per_s": r.goodput_per_s,
    }
    for name, p in latency.items():
        for q in _QUANTILES:
            figure = None if p is None else getattr(p, q)
            row[f"{name}_{q}"] = "" if figure is None else figure
    row.update(_new_figures(r))
    return row


def _cell(value: float | None) -> Any:
    return "" if value is None else value


def _new_figures(r: StrategyResult) -> dict[str, Any]:
    """Time-outs, hint accuracy, recovery, priorities, scraped peaks, memory."""
    hints, rec = r.hint_accuracy, r.recovery
    row: dict[str, Any] = {
        "timeouts": r.timeouts,
        "hint_count": "" if hints is None else hints.hints,
        "hint_error_ms_p50": _cell(None if hints is None else hints.error_ms_p50),
        "hint_error_ms_p90": _cell(None if hints is None else hints.error_ms_p90),
        "hint_within": _cell(None if hints is None else hints.within),
        "recovery_yields_s": _cell(None if rec is None else rec.yields_s),
        "recovery_latency_s": _cell(None if rec is None else rec.latency_s),
        "recovery_s": _cell(None if rec is None else rec.recovery_s),
        "server_rss_peak_mb": _cell(
            None if r.server_rss_peak_bytes is None else r.server_rss_peak_bytes / 2**20
        ),
        "unreachable": r.unreachable or "",
        "complete": int(r.complete),
    }
    classes = {c.priority: c for c in r.priorities}
    for name in _PRIORITIES:
        c = classes.get(name)
        row[f"priority_{name}_requests"] = "" if c is None else c.requests
        row[f"priority_{name}_success_rate"] = "" if c is None else c.success_rate
        row[f"priority_{name}_e2e_ms_p99"] = _cell(
            None if c is None or c.latency_s_p99 is None else c.latency_s_p99 * 1000
        )
        row[f"priority_{name}_jain"] = _cell(None if c is None else c.jain)
    for series in ("queue", "running", "kv_cache"):
        values = [v for p in r.timeline if (v := getattr(p, f"scraped_{series}")) is not None]
        row[f"scraped_{series}_peak"] = max(values) if values else ""
    return row


def csv_rows(report: BurstReport | SweepReport) -> list[dict[str, Any]]:
    """The rows ``write_csv`` writes, keyed by ``CSV_COLUMNS``."""
    if isinstance(report, SweepReport):
        return [
            _row(report.sweep.axis, value, point.config, r)
            for value, point in report.points
            for r in point.results
        ]
    return [_row(None, None, report.config, r) for r in report.results]


def write_csv(report: BurstReport | SweepReport, path: str | Path) -> Path:
    """Write ``report`` to ``path`` as CSV with the header ``CSV_COLUMNS``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(csv_rows(report))
    return out

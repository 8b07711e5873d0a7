"""The results, for people: a rich table (strategies as columns) and a Markdown table."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from yieldgate.burst._results import BurstReport, Percentiles, StrategyResult

__all__ = ["markdown_table", "render_table", "summary_line"]


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pcts(p: Percentiles | None, digits: int) -> str:
    if p is None or p.count == 0:
        return "-"
    return f"{_f(p.p50, digits)} / {_f(p.p95, digits)} / {_f(p.p99, digits)}"


def _errors(r: StrategyResult, sep: str) -> str:
    """Each kind as the JSON and the CSV spell it (an exception's class name is what a
    user catches), an unreachable target first and why: a breaker it opened comes after."""
    if not r.errors_by_kind:
        return "-"
    kinds = sorted(r.errors_by_kind.items(), key=lambda item: (item[0] != "unreachable", item[0]))
    return sep.join(
        f"{kind} {n}: {r.unreachable}" if kind == "unreachable" and r.unreachable else f"{kind} {n}"
        for kind, n in kinds
    )


def _ratio(r: StrategyResult) -> str:
    ratio = r.makespan_ratio
    return "n/a" if ratio is None else f"{ratio:.2f}"


def _slo_text(report: BurstReport) -> str:
    slo: Mapping[str, Any] = report.config.get("slo", {})
    parts = [
        f"{k.removesuffix('_ms').upper()} <= {v:g} ms" for k, v in slo.items() if v is not None
    ]
    return ", ".join(parts) if parts else "no SLO: every success counts"


def _serving(r: StrategyResult, key: str) -> str:
    if r.server is None or not r.server.serving:
        return "-"
    value = r.server.serving.get(key)
    if not isinstance(value, Mapping):
        return "-"
    return " / ".join(_f(value.get(q), 1) for q in ("p50", "p95", "p99"))


def _streaming_cell(key: str) -> Callable[[StrategyResult], str]:
    def cell(r: StrategyResult) -> str:
        return _pcts(r.streaming.get(key) if r.streaming else None, 1)

    return cell


def _rows(report: BurstReport, sep: str) -> list[tuple[str, Callable[[StrategyResult], str]]]:
    rows: list[tuple[str, Callable[[StrategyResult], str]]] = [
        ("success", lambda r: f"{r.success_rate:.1%}"),
        ("attempts / request", lambda r: f"{r.attempts_per_request:.2f} ({r.attempts})"),
        ("yields seen", lambda r: str(r.yields)),
        ("errors by kind", lambda r: _errors(r, sep)),
        ("makespan s", lambda r: _f(r.makespan_s)),
        ("lower bound s", lambda r: _f(r.lower_bound_s)),
        ("makespan / bound", _ratio),
        ("rates' window s", lambda r: _f(r.window_s)),
        ("latency p50/p95/p99 s", lambda r: _pcts(r.latency_s, 2)),
    ]
    if any(r.streaming for r in report.results):
        for key, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT"), ("itl_ms", "ITL")):
            rows.append((f"{name} p50/p95/p99 ms", _streaming_cell(key)))
    rows.append(
        (
            "goodput",
            lambda r: f"{r.goodput_ratio:.1%}, {r.goodput_per_s:.1f}/s",
        )
    )
    if any(r.server is not None for r in report.results):
        rows.append(
            (
                "server executed / yielded",
                lambda r: (
                    "-"
                    if r.server is None
                    else f"{r.server.delta['executed']} / {r.server.delta['yielded']}"
                ),
            )
        )
        rows.append(
            (
                "server exec ms (mean)",
                lambda r: "-" if r.server is None else _f(r.server.exec_ms_mean, 1),
            )
        )
    rows.extend(_new_rows(report))
    if any(r.server is not None and r.server.serving for r in report.results):
        rows.append(("server TTFT p50/p95/p99 ms", lambda r: _serving(r, "ttft_ms")))
        rows.append(("server TPOT p50/p95/p99 ms", lambda r: _serving(r, "tpot_ms")))
    return rows


def _hints(r: StrategyResult) -> str:
    h = r.hint_accuracy
    if h is None or not h.resolved:
        return "-"
    within = "-" if h.within is None else f"{h.within:.0%}"
    return f"{_f(h.error_ms_p50, 1)} / {_f(h.error_ms_p90, 1)} ({within} of {h.resolved})"


def _recovery(r: StrategyResult) -> str:
    rec = r.recovery
    if rec is None:
        return "-"
    latency = "-" if rec.latency_s is None else _f(rec.latency_s)
    return f"{_f(rec.yields_s)} / {latency}"


def _scraped(r: StrategyResult) -> str:
    def peak(name: str) -> str:
        values = [v for p in r.timeline if (v := getattr(p, name)) is not None]
        return f"{max(values):g}" if values else "-"

    return f"{peak('scraped_queue')} / {peak('scraped_running')}"


def _priority_cell(name: str) -> Callable[[StrategyResult], str]:
    def cell(r: StrategyResult) -> str:
        found = next((c for c in r.priorities if c.priority == name), None)
        if found is None:
            return "-"
        return f"{found.success_rate:.1%}, {_f(found.latency_s_p99)} s, {_f(found.jain)}"

    return cell


def _new_rows(report: BurstReport) -> list[tuple[str, Callable[[StrategyResult], str]]]:
    """Time-outs, hint accuracy, recovery, per-priority figures, server memory (issue 21)."""
    rows: list[tuple[str, Callable[[StrategyResult], str]]] = []
    results = report.results
    if report.config.get("timeout_s") is not None or any(r.timeouts for r in results):
        rows.append(("time-outs", lambda r: str(r.timeouts)))
    if any(r.hint_accuracy is not None and r.hint_accuracy.resolved for r in results):
        rows.append(("hint error p50/p90 ms (within)", _hints))
    if any(r.recovery is not None for r in results):
        rows.append(("recovery s (yields / latency)", _recovery))
    names = [
        n
        for n in ("high", "normal", "low")
        if any(c.priority == n for r in results for c in r.priorities)
    ]
    for name in names:
        rows.append((f"{name}: success, p99, Jain", _priority_cell(name)))
    if any(p.scraped_queue is not None for r in results for p in r.timeline):
        rows.append(("scraped queue / running peak", _scraped))
    if any(r.server_rss_peak_bytes is not None for r in results):
        rows.append(
            (
                "server RSS peak MiB",
                lambda r: (
                    "-"
                    if r.server_rss_peak_bytes is None
                    else f"{r.server_rss_peak_bytes / 2**20:.0f}"
                ),
            )
        )
    return rows


def _title(report: BurstReport) -> str:
    c = report.config
    name = f"{c['scenario']}: " if c.get("scenario") else ""
    stream = ", streaming" if c.get("stream") else ""
    fresh = "fresh server per strategy" if c.get("fresh_server_per_strategy") else "shared server"
    cap = f", concurrency {c['concurrency']}" if c.get("concurrency") else ""
    workers = f", from {c['workers']} workers" if c.get("workers", 1) > 1 else ""
    return (
        f"{name}{c['requests']} requests, {c['profile']['spec']}{cap}{stream}{workers} "
        f"-> {c['target']} "
        f"({fresh})"
    )


def summary_line(report: BurstReport) -> str:
    """One line per goal verdict, for the end of the output."""
    return "\n".join(
        f"{label}: {text}: {'met' if met else 'NOT met'}" for label, met, text in report.verdicts()
    )


def render_table(report: BurstReport, console: Any = None) -> None:
    """Print the results as a rich table: one column per strategy."""
    from rich.console import Console
    from rich.table import Table

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=120)  # piped: wide enough for four strategies
    from rich.text import Text

    # Text, not a string: rich would read "gamma:100:0.5" as markup with a :100: emoji.
    table = Table(title=Text(_title(report)), title_justify="left", show_lines=False)
    table.add_column("", style="bold")
    for r in report.results:
        table.add_column(r.label if r.complete else f"{r.label} (cut short)", justify="right")
    for name, cell in _rows(report, "\n"):
        table.add_row(name, *(cell(r) for r in report.results))
    console.print(table)
    console.print(f"goodput: {_slo_text(report)}")
    if report.interrupted:
        console.print(Text(f"partial results, {report.stopped_by}; {_unfinished(report)}"))
    verdicts = summary_line(report)
    if verdicts:
        console.print(verdicts)


def _unfinished(report: BurstReport) -> str:
    names = list(report.unfinished)
    return f"not finished: {', '.join(names)}" if names else "every strategy finished"


def markdown_table(report: BurstReport) -> str:
    """The same figures as a Markdown table (one row per strategy), for docs."""
    rows = _rows(report, "; ")
    head = "| strategy | " + " | ".join(name for name, _ in rows) + " |"
    rule = "| --- |" + " ---: |" * len(rows)
    lines = [head, rule]
    for r in report.results:
        lines.append(f"| {r.label} | " + " | ".join(cell(r) for _, cell in rows) + " |")
    return "\n".join(lines)

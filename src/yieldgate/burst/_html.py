"""The HTML report: one self-contained page for a burst or a sweep.

Nothing in it reaches the network: the plots are inline SVG drawn by
matplotlib (imported only when a report is written), the stylesheet is inline,
there is no script, and a Content-Security-Policy forbids every fetch. Every
string that came from outside (labels, model names, URLs, config values) is
escaped, both in the HTML (``html.escape``) and in the SVG (matplotlib escapes
its text; ``$`` is escaped so mathtext cannot read it).

The page is drawn from the results' own figures (the terminal table's rows and
the CSV's columns) and, so that fields added to a result or a timeline point
later still show, from their dict form: an unknown numeric field of a result is
a row of "other figures", and an unknown numeric series of the timeline (say,
one scraped from the server) gets a panel of its own.

Here: the page, its tables and where each figure goes; the plots themselves
are ``_html_plots``.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from yieldgate.burst._csv import csv_rows
from yieldgate.burst._html_plots import (
    flatten,
    goodput_plot,
    latency_plot,
    pareto_plot,
    plot_colors,
)
from yieldgate.burst._html_timeline import timeline_plot
from yieldgate.burst._report import _rows, _slo_text, _title
from yieldgate.burst._results import BurstReport
from yieldgate.burst._sweep import SweepReport

__all__ = ["PLOT_IDS", "html_report", "write_html"]

# Each plot is a <figure class="plot"> with one of these ids (timelines: one per
# point of a sweep, ``plot-timeline-N``; a single burst: ``plot-timeline``).
PLOT_IDS = ("plot-latency", "plot-goodput", "plot-pareto", "plot-timeline")

# A sweep with more points shows the last point's timeline only.
_MAX_TIMELINES = 12

_RESULT_KEYS = frozenset(
    {
        # Shown by the terminal table's own rows (``_report``).
        "timeouts",
        "hint_accuracy",
        "recovery",
        "priorities",
        "server_rss_peak_bytes",
        "unreachable",  # in the errors' row
        "strategy",
        "label",
        "requests",
        "succeeded",
        "failed",
        "success_rate",
        "attempts",
        "attempts_per_request",
        "yields",
        "errors_by_kind",
        "makespan_s",
        "lower_bound_s",
        "makespan_ratio",
        "offered_s",
        "window_s",
        "latency_s",
        "streaming",
        "throughput_per_s",
        "output_tokens",
        "tokens_per_s",
        "goodput",
        "server",
        "timeline",
    }
)

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
.interrupted{background:#fdecea;border:2px solid #b3261e;padding:.6rem 1rem;border-radius:4px}
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1b1b;
background:#fff;max-width:70rem;margin:1.5rem auto;padding:0 1rem}
h1{font-size:1.5rem;margin:0 0 .3rem}h2{font-size:1.2rem;margin:2rem 0 .5rem;
border-bottom:1px solid #ddd;padding-bottom:.2rem}h3{font-size:1rem;margin:1.2rem 0 .4rem}
p.lead{color:#444;margin:.2rem 0}
table{border-collapse:collapse;margin:.5rem 0;font-variant-numeric:tabular-nums}
th,td{border:1px solid #ddd;padding:.25rem .55rem;vertical-align:top}
thead th{background:#f4f4f4}td.num{text-align:right;white-space:nowrap}
th[scope=row]{text-align:left;font-weight:600;background:#fafafa}
table.kv td{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.9em}
figure.plot{margin:1rem 0}figure.plot svg{max-width:100%;height:auto;display:block}
figcaption{font-weight:600;margin:.3rem 0}figure.plot p{margin:.2rem 0;color:#444}
svg *{stroke-linejoin:round;stroke-linecap:butt}
.met{color:#11691c}.missed{color:#a31515}
details{margin:.4rem 0}summary{cursor:pointer;font-weight:600}
footer{margin-top:2rem;color:#666;font-size:.85em}
"""


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}"
    if isinstance(value, list | tuple):
        if any(isinstance(v, list | tuple | Mapping) for v in value):
            return json.dumps(value, default=str)
        return " ".join(_fmt(v) for v in value) if value else "-"
    return str(value)


def _plot_figure(fig_id: str, caption: str, svg: str, notes: Sequence[str] = ()) -> str:
    parts = [f'<figure class="plot" id="{_e(fig_id)}">', f"<figcaption>{_e(caption)}</figcaption>"]
    parts.append(svg)
    parts.extend(f"<p>{_e(n)}</p>" for n in notes)
    parts.append("</figure>")
    return "\n".join(parts)


# --- the tables -----------------------------------------------------------------------


def _counts(counts: Mapping[str, int]) -> str:
    return "; ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "-"


def _more_rows(report: BurstReport) -> list[tuple[str, list[str]]]:
    """Rows the terminal table leaves out but the CSV has, then any unknown field."""
    results = report.results
    rows: list[tuple[str, list[str]]] = [
        ("HTTP 429 (failed on)", [str(r.errors_by_kind.get("HTTP 429", 0)) for r in results]),
    ]
    if any(r.server is not None for r in results):
        rows.append(
            (
                "server yields by reason",
                ["-" if r.server is None else _counts(r.server.yielded_by_reason) for r in results],
            )
        )
    rows.append(("offered window s (last arrival)", [f"{r.offered_s:.2f}" for r in results]))
    rows.append(
        ("throughput, successes/s of window", [f"{r.throughput_per_s:.2f}" for r in results])
    )
    if any(r.output_tokens is not None for r in results):
        rows.append(("output tokens", [_fmt(r.output_tokens) for r in results]))
        rows.append(("tokens/s", [_fmt(r.tokens_per_s) for r in results]))
    extra: dict[str, list[str]] = {}
    flat = [
        flatten({k: v for k, v in r.as_dict(timeline=False).items() if k not in _RESULT_KEYS})
        for r in results
    ]
    for key in dict.fromkeys(k for f in flat for k in f):
        extra[key] = [_fmt(f.get(key)) for f in flat]
    rows.extend(extra.items())
    return rows


def _strategy_table(report: BurstReport) -> str:
    results = report.results
    head = "".join(f'<th scope="col">{_e(r.label)}</th>' for r in results)
    lines = [f'<table class="summary"><thead><tr><th></th>{head}</tr></thead><tbody>']
    rows = [(name, [cell(r) for r in results]) for name, cell in _rows(report, "; ")]
    for name, cells in rows + _more_rows(report):
        tds = "".join(f'<td class="num">{_e(c)}</td>' for c in cells)
        lines.append(f'<tr><th scope="row">{_e(name)}</th>{tds}</tr>')
    lines.append("</tbody></table>")
    lines.append(f"<p>Goodput: {_e(_slo_text(report))}.</p>")
    verdicts = report.verdicts()
    if verdicts:
        lines.append("<ul>")
        for label, met, text in verdicts:
            cls, word = ("met", "met") if met else ("missed", "NOT met")
            lines.append(f'<li>{_e(label)}: {_e(text)}: <strong class="{cls}">{word}</strong></li>')
        lines.append("</ul>")
    return "\n".join(lines)


_OVERVIEW = (
    ("success", "success_rate", "pct"),
    ("attempts / request", "attempts_per_request", "2"),
    ("yields", "yields", "int"),
    ("HTTP 429", "http_429", "int"),
    ("e2e p50 ms", "e2e_ms_p50", "1"),
    ("e2e p99 ms", "e2e_ms_p99", "1"),
    ("TTFT p50 ms", "ttft_ms_p50", "1"),
    ("TTFT p99 ms", "ttft_ms_p99", "1"),
    ("goodput", "goodput_ratio", "pct"),
    ("goodput/s", "goodput_per_s", "2"),
    ("throughput/s", "throughput_per_s", "2"),
    ("tokens/s", "tokens_per_s", "1"),
)


def _cell(value: Any, kind: str) -> str:
    if value == "" or value is None:
        return "-"
    if kind == "pct":
        return f"{float(value):.1%}"
    if kind == "int":
        return str(value)
    return f"{float(value):.{kind}f}"


def _overview_table(report: SweepReport) -> str:
    rows = csv_rows(report)
    columns = [c for c in _OVERVIEW if any(r[c[1]] != "" for r in rows)]
    head = "".join(f'<th scope="col">{_e(name)}</th>' for name, _, _ in columns)
    axis = _e(report.sweep.axis)
    lines = [
        f'<table class="overview"><thead><tr><th scope="col">{axis}</th>'
        f'<th scope="col">strategy</th>{head}</tr></thead><tbody>'
    ]
    for r in rows:
        tds = "".join(f'<td class="num">{_e(_cell(r[key], kind))}</td>' for _, key, kind in columns)
        lines.append(
            f'<tr><td class="num">{_e(r["value"])}</td><th scope="row">{_e(r["label"])}</th>'
            f"{tds}</tr>"
        )
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _kv_table(values: Mapping[str, Any], css_id: str) -> str:
    lines = [f'<table class="kv" id="{_e(css_id)}"><tbody>']
    for key, value in flatten(values).items():
        lines.append(f'<tr><th scope="row">{_e(key)}</th><td>{_e(_fmt(value))}</td></tr>')
    lines.append("</tbody></table>")
    return "\n".join(lines)


# --- the page -------------------------------------------------------------------------


def _page(title: str, lead: Sequence[str], body: Sequence[str], created: str) -> str:
    leads = "\n".join(f'<p class="lead">{_e(line)}</p>' for line in lead)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<header>\n<h1>{_e(title)}</h1>\n{leads}\n</header>\n<main>\n"
        + "\n".join(body)
        + f"\n</main>\n<footer>Written by yieldgate burst, {_e(created)}. "
        "Self-contained: no scripts, nothing fetched.</footer>\n</body>\n</html>\n"
    )


def _burst_page(report: BurstReport) -> str:
    colors = plot_colors(r.label for r in report.results)
    pareto, pareto_notes = pareto_plot(report, colors)
    timeline, timeline_notes = timeline_plot(report, colors, "plot-timeline")
    body = [
        "<section>\n<h2>Results</h2>",
        _strategy_table(report),
        "</section>",
        "<section>\n<h2>Plots</h2>",
        _plot_figure(
            "plot-pareto",
            "Goodput against p99 latency, per strategy; the Pareto front ringed",
            pareto,
            pareto_notes,
        ),
        _plot_figure(
            "plot-timeline",
            "Timeline: in flight, yields, completions and failures, one line per strategy",
            timeline,
            timeline_notes,
        ),
        "</section>",
        "<section>\n<h2>Configuration</h2>",
        _kv_table(report.config, "config"),
    ]
    if report.goal is not None:
        body += ["<h3>Goal</h3>", _kv_table(report.goal.as_dict(), "goal")]
    body += ["</section>", "<section>\n<h2>Machine</h2>", _kv_table(report.machine, "machine")]
    body.append("</section>")
    scenario = report.config.get("scenario")
    title = f"yieldgate burst: {scenario}" if scenario else "yieldgate burst"
    return _page(title, [_title(report)], body, report.created)


def _sweep_page(report: SweepReport) -> str:
    colors = plot_colors(r.label for _, r in report.rows())
    pareto, pareto_notes = pareto_plot(report, colors)
    sweep = report.sweep
    body = [
        "<section>\n<h2>Results</h2>",
        _overview_table(report),
        "</section>",
        "<section>\n<h2>Plots</h2>",
        _plot_figure(
            "plot-latency",
            f"Latency against {sweep.axis}, one colour per strategy",
            latency_plot(report, colors),
        ),
        _plot_figure(
            "plot-goodput",
            f"Goodput against {sweep.axis}, one colour per strategy",
            goodput_plot(report, colors),
        ),
        _plot_figure(
            "plot-pareto",
            f"Goodput against p99 latency, every strategy at every {sweep.axis} "
            "(labelled); the Pareto front ringed",
            pareto,
            pareto_notes,
        ),
        "</section>",
        "<section>\n<h2>Points</h2>",
    ]
    shown = {len(report.points) - 1} if len(report.points) > _MAX_TIMELINES else None
    last = len(report.points) - 1
    for n, (value, point) in enumerate(report.points):
        name = f"{sweep.axis}={value:g}"
        attrs = " open" if n == last else ""
        body.append(f"<details{attrs}>\n<summary>{_e(name)}: {_e(_title(point))}</summary>")
        body.append(_strategy_table(point))
        if shown is None or n in shown:
            fig_id = f"plot-timeline-{n + 1}"
            timeline, notes = timeline_plot(point, colors, fig_id)
            body.append(
                _plot_figure(
                    fig_id,
                    f"Timeline at {name}: in flight, yields and completions",
                    timeline,
                    notes,
                )
            )
        body.append("</details>")
    if shown is not None:
        body.append(f"<p>Timelines: the last point's only (more than {_MAX_TIMELINES} points).</p>")
    body += [
        "</section>",
        "<section>\n<h2>Configuration</h2>",
        _kv_table({"sweep": {"axis": sweep.axis, "spec": sweep.describe()}}, "sweep"),
        _kv_table(report.config, "config"),
        "</section>",
        "<section>\n<h2>Machine</h2>",
        _kv_table(report.machine, "machine"),
        "</section>",
    ]
    c = report.config
    lead = [f"sweep {sweep.describe()}: {c.get('requests')} requests a point -> {c.get('target')}"]
    if c.get("serve_args"):
        lead.append("yieldgate serve " + " ".join(map(str, c["serve_args"])))
    return _page("yieldgate burst: sweep", lead, body, report.created)


def html_report(report: BurstReport | SweepReport) -> str:
    """The report as one self-contained HTML page (``write_html`` writes it); a run cut
    short has a banner that says so, first thing on the page."""
    page = _sweep_page(report) if isinstance(report, SweepReport) else _burst_page(report)
    if not report.interrupted:
        return page
    if isinstance(report, SweepReport):
        left = [f"{report.sweep.axis}={v:g}" for v in report.unfinished_points]
        cut = [f"{report.sweep.axis}={v:g}: {n}" for v, p in report.points for n in p.unfinished]
        unfinished = cut + [f"{name} (not run)" for name in left]
    else:
        unfinished = list(report.unfinished)
    banner = (
        '<p class="interrupted" role="alert" id="interrupted"><strong>Interrupted: '
        f"a partial report.</strong> {_e(report.stopped_by)}. Not finished: "
        f"{_e(', '.join(unfinished) or 'none')}. A result cut short counts its requests "
        "in flight or not yet sent as <code>interrupted</code>.</p>\n"
    )
    return page.replace("<main>\n", "<main>\n" + banner, 1)


def write_html(report: BurstReport | SweepReport, path: str | Path) -> Path:
    """Write ``report`` to ``path`` as one self-contained HTML page: the summary tables,
    the plots (inline SVG), the config and the machine; it fetches nothing."""
    out = Path(path)
    text = html_report(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out

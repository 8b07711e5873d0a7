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
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from yieldgate.burst._csv import csv_rows
from yieldgate.burst._report import _rows, _slo_text, _title
from yieldgate.burst._results import BurstReport, StrategyResult
from yieldgate.burst._sweep import SweepReport

__all__ = ["PLOT_IDS", "html_report", "write_html"]

# Each plot is a <figure class="plot"> with one of these ids (timelines: one per
# point of a sweep, ``plot-timeline-N``; a single burst: ``plot-timeline``).
PLOT_IDS = ("plot-latency", "plot-goodput", "plot-pareto", "plot-timeline")

# A sweep with more points shows the last point's timeline only.
_MAX_TIMELINES = 12
_MAX_EXTRA_SERIES = 6

_RESULT_KEYS = frozenset(
    {
        # Shown by the terminal table's own rows (``_report``).
        "timeouts",
        "hint_accuracy",
        "recovery",
        "priorities",
        "server_rss_peak_bytes",
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
_POINT_KEYS = frozenset(
    {
        "t_s",
        "client_inflight",
        "client_attempts",
        "client_yields",
        "completed",
        "failed",
        "server_inflight",
        "server_executed",
        "server_yielded",
    }
)

# Timeline series the burst records beyond the core ones: their titles, and a unit scale.
_SERIES_TITLES = {
    "scraped_queue": "queue (scraped)",
    "scraped_running": "running (scraped)",
    "scraped_kv_cache": "KV cache use (scraped)",
    "server_rss_bytes": "server memory (RSS), MiB",
}
_SERIES_SCALE = {"server_rss_bytes": 1 / 2**20}

_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
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


def _mpl(text: str) -> str:
    """Text for matplotlib: a ``$`` would start mathtext."""
    return text.replace("$", r"\$")


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


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


def _flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping):
            out.update(_flatten(item, f"{name}.") if item else {name: None})
        else:
            out[name] = item
    return out


# --- the plots ------------------------------------------------------------------------


def _svg(fig: Any, prefix: str) -> str:
    """``fig`` as an inline <svg>: no XML prolog, no metadata, ids made unique in the page."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.DOTALL)
    text = re.sub(r"<style[^>]*>.*?</style>\s*", "", text, flags=re.DOTALL)

    # Text is escaped (a "<" in a label is "&lt;"), so every "<...>" here is a tag.
    def tag(match: re.Match[str]) -> str:
        t = re.sub(r'\bid="([^"]+)"', rf'id="{prefix}-\1"', match[0])
        t = re.sub(r'href="#([^"]+)"', rf'href="#{prefix}-\1"', t)
        return re.sub(r"url\(#([^)]+)\)", rf"url(#{prefix}-\1)", t)

    text = re.sub(r"<[^>]*>", tag, text)
    return text.replace("<svg ", '<svg role="img" ', 1)


def _figure(rows: int, height: float) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig, axes


def _render(fig: Any, prefix: str) -> str:
    import matplotlib

    # Text stays text (the page's fonts, no glyphs as paths); ids are stable run to run.
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "yieldgate"}):
        return _svg(fig, prefix)


def _legend(ax: Any, loc: str) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc=loc)


def _colors(labels: Iterable[str]) -> dict[str, str]:
    return {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}


def _or_nan(value: float | None, scale: float = 1.0) -> float:
    return math.nan if value is None else value * scale


def _sweep_axis(ax: Any, report: SweepReport) -> None:
    values = report.sweep.values
    if len(values) > 2 and min(values) > 0 and max(values) / min(values) >= 8:
        ax.set_xscale("log")
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
    ax.set_xlabel("arrival rate, requests/s" if report.sweep.axis == "rate" else "concurrency")


def _series(report: SweepReport) -> dict[str, list[tuple[float, StrategyResult]]]:
    out: dict[str, list[tuple[float, StrategyResult]]] = {}
    for value, r in report.rows():
        out.setdefault(r.label, []).append((value, r))
    return out


def _latency_plot(report: SweepReport, colors: Mapping[str, str]) -> str:
    stream = any(r.streaming for _, r in report.rows())
    fig, axes = _figure(2 if stream else 1, 5.6 if stream else 3.4)
    for label, points in _series(report).items():
        xs = [v for v, _ in points]
        c = colors[label]
        axes[0].plot(
            xs, [_or_nan(r.latency_s.p50) for _, r in points], "o-", c=c, label=_mpl(label)
        )
        axes[0].plot(xs, [_or_nan(r.latency_s.p99) for _, r in points], "o--", c=c)
        if stream:
            ttft = [(r.streaming or {}).get("ttft_ms") for _, r in points]
            axes[1].plot(xs, [_or_nan(p.p50 if p else None) for p in ttft], "o-", c=c)
            axes[1].plot(xs, [_or_nan(p.p99 if p else None) for p in ttft], "o--", c=c)
    axes[0].set_ylabel("end-to-end latency, s")
    axes[0].set_title("end-to-end latency of successes (solid p50, dashed p99)", loc="left")
    if stream:
        axes[1].set_ylabel("TTFT, ms")
        axes[1].set_title("time to first token (solid p50, dashed p99)", loc="left")
    _legend(axes[0], "upper left")
    _sweep_axis(axes[-1], report)
    return _render(fig, "plot-latency")


def _goodput_plot(report: SweepReport, colors: Mapping[str, str]) -> str:
    fig, axes = _figure(2, 5.2)
    for label, points in _series(report).items():
        xs = [v for v, _ in points]
        c = colors[label]
        axes[0].plot(xs, [r.goodput_per_s for _, r in points], "o-", c=c, label=_mpl(label))
        axes[0].plot(xs, [r.throughput_per_s for _, r in points], ":", c=c)
        axes[1].plot(xs, [100 * r.goodput_ratio for _, r in points], "o-", c=c)
        axes[1].plot(xs, [100 * r.success_rate for _, r in points], ":", c=c)
    axes[0].set_ylabel("requests/s")
    axes[0].set_title("goodput per second (solid; dotted: all successes)", loc="left")
    axes[1].set_ylabel("% of requests")
    axes[1].set_title("goodput share of requests (solid; dotted: success rate)", loc="left")
    axes[1].set_ylim(-3, 103)
    _legend(axes[0], "upper left")
    _sweep_axis(axes[-1], report)
    return _render(fig, "plot-goodput")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the ``(latency, throughput)`` points no other point beats: none has
    latency as low and throughput as high, and one of them strictly. By latency."""
    front = []
    for i, (lat, thr) in enumerate(points):
        beaten = any(
            (lo <= lat and hi >= thr) and (lo < lat or hi > thr)
            for j, (lo, hi) in enumerate(points)
            if j != i
        )
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def _pareto_candidates(
    report: BurstReport | SweepReport,
) -> list[tuple[str, float | None, float, float, float]]:
    """``(label, value, latency p99 s, throughput/s, success rate)`` of every run with
    a success."""
    rows: list[tuple[float | None, StrategyResult]] = (
        [(v, r) for v, r in report.rows()]
        if isinstance(report, SweepReport)
        else [(None, r) for r in report.results]
    )
    return [
        (r.label, v, r.latency_s.p99, r.throughput_per_s, r.success_rate)
        for v, r in rows
        if r.latency_s.p99 is not None
    ]


def _pareto_plot(
    report: BurstReport | SweepReport, colors: Mapping[str, str]
) -> tuple[str, list[str]]:
    candidates = _pareto_candidates(report)
    front = pareto_front([(lat, thr) for _, _, lat, thr, _ in candidates])
    success = [c[4] for c in candidates]
    fig, axes = _figure(1, 4.2)
    ax = axes[0]
    for label in colors:
        mine = [(v, lat, thr) for lbl, v, lat, thr, _ in candidates if lbl == label]
        if not mine:
            continue
        ax.plot(
            [lat for _, lat, _ in mine],
            [thr for _, _, thr in mine],
            "o",
            c=colors[label],
            label=_mpl(label),
            ms=7,
        )
        for v, lat, thr in mine:
            if v is not None:
                ax.annotate(f"{v:g}", (lat, thr), textcoords="offset points", xytext=(5, 4))
    if front:
        fx = [candidates[i][2] for i in front]
        fy = [candidates[i][3] for i in front]
        ax.step(fx, fy, where="post", c="black", lw=2, alpha=0.35, label="Pareto front")
        ax.plot(fx, fy, "o", mfc="none", mec="black", ms=13, mew=1.5)
    ax.set_xlabel("end-to-end latency p99, s (lower is better)")
    ax.set_ylabel("throughput, successes/s (higher is better)")
    if not candidates:
        ax.text(0.5, 0.5, "no run succeeded", transform=ax.transAxes, ha="center", va="center")
    _legend(ax, "best")
    axis = report.sweep.axis if isinstance(report, SweepReport) else ""
    names = []
    for i in front:
        label, value, lat, thr, _ = candidates[i]
        at = "" if value is None else f" at {axis}={value:g}"
        names.append(f"{label}{at}: {thr:.1f}/s ({success[i]:.1%} success), p99 {lat:.3g} s")
    return _render(fig, "plot-pareto"), names


def _point_dicts(r: StrategyResult) -> list[dict[str, Any]]:
    return [_flatten(p.as_dict()) for p in r.timeline]


def _extra_series(results: Sequence[StrategyResult]) -> list[str]:
    """Numeric timeline fields beyond the known ones (a scraped series, say), in order."""
    seen: dict[str, None] = {}
    for r in results:
        for point in _point_dicts(r):
            for key, value in point.items():
                if key not in _POINT_KEYS and _num(value):
                    seen.setdefault(key)
    return list(seen)


def _timeline_plot(report: BurstReport, colors: Mapping[str, str], prefix: str) -> str:
    results = report.results
    server = bool(results) and all(
        r.timeline and r.timeline[0].server_inflight is not None for r in results
    )
    extras = _extra_series(results)[:_MAX_EXTRA_SERIES]
    fig, axes = _figure(3 + len(extras), 2.1 * (3 + len(extras)) + 0.4)
    where = "server" if server else "client"
    for r in results:
        points = _point_dicts(r)
        if not points:
            continue
        c, label = colors[r.label], _mpl(r.label)
        t = [p["t_s"] for p in points]
        inflight = [p["server_inflight" if server else "client_inflight"] for p in points]
        yields = [p["server_yielded" if server else "client_yields"] for p in points]
        axes[0].step(t, [_or_nan(v) for v in inflight], where="post", c=c, label=label)
        axes[1].plot(t, [_or_nan(v) for v in yields], c=c)
        axes[2].plot(t, [p["completed"] for p in points], c=c)
        axes[2].plot(t, [p["failed"] for p in points], "--", c=c)
        for ax, key in zip(axes[3:], extras, strict=False):
            ys: list[Any] = [p.get(key) for p in points]
            scale = _SERIES_SCALE.get(key, 1.0)
            ax.plot(t, [y * scale if _num(y) else math.nan for y in ys], c=c)
    caps = {r.server.max_inflight for r in results if r.server is not None}
    if server and len(caps) == 1:
        axes[0].axhline(caps.pop(), color="grey", ls="--", lw=1, label="max_inflight")
    axes[0].set_title(f"in flight ({where})", loc="left")
    axes[1].set_title(f"yields, cumulative ({where})", loc="left")
    axes[2].set_title("requests completed (solid) and failed (dashed), cumulative", loc="left")
    for ax, key in zip(axes[3:], extras, strict=False):
        ax.set_title(_mpl(_SERIES_TITLES.get(key, key)), loc="left")
    _legend(axes[0], "best")
    axes[-1].set_xlabel("seconds since the first arrival")
    return _render(fig, prefix)


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
    rows.append(("throughput, successes/s", [f"{r.throughput_per_s:.2f}" for r in results]))
    if any(r.output_tokens is not None for r in results):
        rows.append(("output tokens", [_fmt(r.output_tokens) for r in results]))
        rows.append(("tokens/s", [_fmt(r.tokens_per_s) for r in results]))
    extra: dict[str, list[str]] = {}
    flat = [
        _flatten({k: v for k, v in r.as_dict(timeline=False).items() if k not in _RESULT_KEYS})
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
    for key, value in _flatten(values).items():
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
    colors = _colors(r.label for r in report.results)
    pareto, front = _pareto_plot(report, colors)
    body = [
        "<section>\n<h2>Results</h2>",
        _strategy_table(report),
        "</section>",
        "<section>\n<h2>Plots</h2>",
        _plot_figure(
            "plot-timeline",
            "Timeline: in flight, yields and completions, one line per strategy",
            _timeline_plot(report, colors, "plot-timeline"),
        ),
        _plot_figure(
            "plot-pareto",
            "Throughput against p99 latency, per strategy; the Pareto front ringed",
            pareto,
            ["On the front: " + "; ".join(front) + "."] if front else ["No run succeeded."],
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
    colors = _colors(r.label for _, r in report.rows())
    pareto, front = _pareto_plot(report, colors)
    sweep = report.sweep
    body = [
        "<section>\n<h2>Results</h2>",
        _overview_table(report),
        "</section>",
        "<section>\n<h2>Plots</h2>",
        _plot_figure(
            "plot-latency",
            f"Latency against {sweep.axis}, one colour per strategy",
            _latency_plot(report, colors),
        ),
        _plot_figure(
            "plot-goodput",
            f"Goodput against {sweep.axis}, one colour per strategy",
            _goodput_plot(report, colors),
        ),
        _plot_figure(
            "plot-pareto",
            f"Throughput against p99 latency, every strategy at every {sweep.axis} "
            "(labelled); the Pareto front ringed",
            pareto,
            ["On the front: " + "; ".join(front) + "."] if front else ["No run succeeded."],
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
            body.append(
                _plot_figure(
                    fig_id,
                    f"Timeline at {name}: in flight, yields and completions",
                    _timeline_plot(point, colors, fig_id),
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
    """The report as one self-contained HTML page (``write_html`` writes it)."""
    if isinstance(report, SweepReport):
        return _sweep_page(report)
    return _burst_page(report)


def write_html(report: BurstReport | SweepReport, path: str | Path) -> Path:
    """Write ``report`` to ``path`` as one self-contained HTML page: the summary tables,
    the plots (inline SVG), the config and the machine; it fetches nothing."""
    out = Path(path)
    text = html_report(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out

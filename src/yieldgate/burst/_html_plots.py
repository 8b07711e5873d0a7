"""The HTML report's plots: matplotlib figures drawn as inline SVG.

Latency and goodput against a sweep's axis, throughput against p99 latency
with its Pareto front, and a run's timeline (with a panel for each numeric
series beyond the core ones, such as one scraped from the server). matplotlib
is imported only when a plot is drawn. Its text is escaped by matplotlib, and
``$`` here, so mathtext cannot read it; each SVG's ids are prefixed so that
several share one page. ``flatten`` turns a result's dict form into dotted
keys, for the timeline's series here and the page's tables (``_html``).

Apart from the page because drawing is matplotlib's business: the page
(``_html``) lays out the figures these return, with the tables, and escapes
everything it writes itself.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from yieldgate.burst._results import BurstReport, StrategyResult
from yieldgate.burst._sweep import SweepReport

__all__ = [
    "flatten",
    "goodput_plot",
    "latency_plot",
    "pareto_front",
    "pareto_plot",
    "plot_colors",
    "timeline_plot",
]


# Panels for series beyond the core ones, at most.
_MAX_EXTRA_SERIES = 6

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


def _mpl(text: str) -> str:
    """Text for matplotlib: a ``$`` would start mathtext."""
    return text.replace("$", r"\$")


def _num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def flatten(value: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``value`` with its nested mappings spelt as dotted keys (an empty one as ``None``)."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, Mapping):
            out.update(flatten(item, f"{name}.") if item else {name: None})
        else:
            out[name] = item
    return out


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


def plot_colors(labels: Iterable[str]) -> dict[str, str]:
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


def latency_plot(report: SweepReport, colors: Mapping[str, str]) -> str:
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


def goodput_plot(report: SweepReport, colors: Mapping[str, str]) -> str:
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


def pareto_plot(
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
    return [flatten(p.as_dict()) for p in r.timeline]


def _extra_series(results: Sequence[StrategyResult]) -> list[str]:
    """Numeric timeline fields beyond the known ones (a scraped series, say), in order."""
    seen: dict[str, None] = {}
    for r in results:
        for point in _point_dicts(r):
            for key, value in point.items():
                if key not in _POINT_KEYS and _num(value):
                    seen.setdefault(key)
    return list(seen)


def timeline_plot(report: BurstReport, colors: Mapping[str, str], prefix: str) -> str:
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

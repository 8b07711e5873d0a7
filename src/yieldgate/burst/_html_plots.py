"""The HTML report's plots: matplotlib figures drawn as inline SVG.

Latency and goodput against a sweep's axis, and goodput against p99 latency
with its Pareto front (``_pareto`` says which runs are on it); a run's
timeline is ``_html_timeline``. One colour, dash pattern and marker per
strategy (``plot_styles``), the same in every plot of a page. matplotlib
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

from yieldgate.burst._pareto import Candidate, candidates, pareto_front
from yieldgate.burst._results import BurstReport, StrategyResult
from yieldgate.burst._sweep import SweepReport

__all__ = [
    "flatten",
    "goodput_plot",
    "latency_plot",
    "pareto_front",
    "pareto_plot",
    "plot_colors",
    "plot_styles",
    "zero_based",
]


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
    """A legend; ``outside``: beside the axes, on the right, where it hides no line."""
    if ax.get_legend_handles_labels()[0]:
        if loc == "outside":
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        else:
            ax.legend(fontsize=8, loc=loc)


def zero_based(ax: Any, top: float) -> None:
    """The y axis from 0 to a tenth above ``top`` (the data's highest), so a flat series
    far from zero shows flat, and the highest point does not sit on the frame."""
    ax.set_ylim(0, top * 1.1 if top > 0 else 1.0)


def plot_colors(labels: Iterable[str]) -> dict[str, str]:
    return {label: f"C{i % 10}" for i, label in enumerate(dict.fromkeys(labels))}


# Per strategy, in the report's order, a dash pattern and a marker of its own.
_DASHES: tuple[tuple[Any, str], ...] = (
    ("-", "o"),
    ("--", "s"),
    ("-.", "^"),
    (":", "D"),
    ((0, (6, 2, 1, 2, 1, 2)), "v"),
    ((0, (1, 1)), "P"),
)


def plot_styles(colors: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Each strategy's line, in the report's order: its colour, a dash pattern and a marker
    of its own, and a width that narrows with the order, drawn later and higher, so a line
    that lies on another leaves the other's edges showing."""
    out = {}
    for i, (label, color) in enumerate(colors.items()):
        ls, marker = _DASHES[i % len(_DASHES)]
        width = max(3.4 - 0.7 * i, 1.2)
        out[label] = {"color": color, "ls": ls, "marker": marker, "lw": width, "zorder": 3 + i}
    return out


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
    styles = plot_styles(colors)
    for label, points in _series(report).items():
        xs = [v for v, _ in points]
        st = styles[label]
        m, c = st["marker"], {"c": st["color"], "lw": st["lw"] * 0.6, "zorder": st["zorder"]}
        axes[0].plot(
            xs, [_or_nan(r.latency_s.p50) for _, r in points], f"{m}-", **c, label=_mpl(label)
        )
        axes[0].plot(xs, [_or_nan(r.latency_s.p99) for _, r in points], f"{m}--", **c)
        if stream:
            ttft = [(r.streaming or {}).get("ttft_ms") for _, r in points]
            axes[1].plot(xs, [_or_nan(p.p50 if p else None) for p in ttft], f"{m}-", **c)
            axes[1].plot(xs, [_or_nan(p.p99 if p else None) for p in ttft], f"{m}--", **c)
    axes[0].set_ylabel("end-to-end latency, s")
    axes[0].set_title("end-to-end latency of successes (solid p50, dashed p99)", loc="left")
    if stream:
        axes[1].set_ylabel("TTFT, ms")
        axes[1].set_title("time to first token (solid p50, dashed p99)", loc="left")
    _legend(axes[0], "outside")
    _sweep_axis(axes[-1], report)
    return _render(fig, "plot-latency")


def goodput_plot(report: SweepReport, colors: Mapping[str, str]) -> str:
    fig, axes = _figure(2, 5.2)
    styles = plot_styles(colors)
    for label, points in _series(report).items():
        xs = [v for v, _ in points]
        st = styles[label]
        m, c = st["marker"], {"c": st["color"], "lw": st["lw"] * 0.6, "zorder": st["zorder"]}
        axes[0].plot(xs, [r.goodput_per_s for _, r in points], f"{m}-", **c, label=_mpl(label))
        axes[0].plot(xs, [r.throughput_per_s for _, r in points], ":", **c)
        axes[1].plot(xs, [100 * r.goodput_ratio for _, r in points], f"{m}-", **c)
        axes[1].plot(xs, [100 * r.success_rate for _, r in points], ":", **c)
    axes[0].set_ylabel("requests/s of the window")
    axes[0].set_ylim(bottom=0)
    axes[0].set_title("goodput per second (solid; dotted: all successes)", loc="left")
    axes[1].set_ylabel("% of requests")
    axes[1].set_title("goodput share of requests (solid; dotted: success rate)", loc="left")
    axes[1].set_ylim(-3, 103)
    _legend(axes[0], "outside")
    _sweep_axis(axes[-1], report)
    return _render(fig, "plot-goodput")


def pareto_plot(
    report: BurstReport | SweepReport, colors: Mapping[str, str]
) -> tuple[str, list[str]]:
    """Goodput against p99 latency, the front (``_pareto``) ringed; and the notes under it:
    the runs on the front, and those kept off it for failing more than 1% of the burst."""
    found, front = candidates(report)
    styles = plot_styles(colors)
    fig, axes = _figure(1, 4.2)
    ax = axes[0]
    for label in colors:
        st = styles[label]
        for on_time in (True, False):
            mine = [c for c in found if c.label == label and c.on_time is on_time]
            if not mine:
                continue
            # Hollow: more than 1% failed, so its burst p99 is infinite (see _pareto).
            fill = {} if on_time else {"mfc": "white", "mew": 1.8}
            shown = not any(c.label == label and c.on_time for c in found) or on_time
            ax.plot(
                [c.result.latency_s.p99 for c in mine],
                [c.goodput_per_s for c in mine],
                st["marker"],
                c=st["color"],
                ms=8,
                ls="none",
                zorder=st["zorder"],
                label=_mpl(label) if shown else None,
                **fill,
            )
            for c in mine:
                # A sweep's points say their value (the notes give their success rates).
                notes = [f"{c.value:g}"] if c.value is not None else []
                if not on_time and c.value is None:
                    notes.append(f"{c.result.failed / c.result.requests:.0%} failed")
                ax.annotate(
                    ", ".join(notes), (c.result.latency_s.p99, c.goodput_per_s),
                    textcoords="offset points", xytext=(6, 4), fontsize=8,
                )  # fmt: skip
    timely = [found[i] for i in front if found[i].on_time]
    if timely:
        ax.step(
            [c.latency_s for c in timely],
            [c.goodput_per_s for c in timely],
            where="post", c="black", lw=2, alpha=0.35,
        )  # fmt: skip
    ringed = [found[i] for i in front]
    if ringed:
        ax.plot(
            [c.result.latency_s.p99 for c in ringed],
            [c.goodput_per_s for c in ringed],
            "o", mfc="none", mec="black", ms=15, mew=1.5, label="Pareto front",
        )  # fmt: skip
    ax.set_xlabel("end-to-end latency p99 of successes, s (lower is better)")
    ax.set_ylabel("goodput, good requests/s\nof the window (higher is better)")
    zero_based(ax, max((c.goodput_per_s for c in found), default=0.0))
    ax.set_xlim(0, 1.1 * max((c.result.latency_s.p99 or 0.0 for c in found), default=0.0) or 1.0)
    if not found:
        ax.text(0.5, 0.5, "no run succeeded", transform=ax.transAxes, ha="center", va="center")
    _legend(ax, "outside")
    return _render(fig, "plot-pareto"), _pareto_notes(report, found, front)


def _pareto_notes(
    report: BurstReport | SweepReport, found: Sequence[Candidate], front: Sequence[int]
) -> list[str]:
    if not found:
        return ["No run succeeded."]
    axis = report.sweep.axis if isinstance(report, SweepReport) else ""

    def name(c: Candidate) -> str:
        at = "" if c.value is None else f" at {axis}={c.value:g}"
        return f"{c.label}{at}"

    def latency(c: Candidate) -> str:
        if c.on_time:
            return f"p99 {c.latency_s:.3g} s"
        return f"p99 of the burst never ({c.result.failed / c.result.requests:.1%} failed)"

    on = [
        f"{name(c)}: {c.goodput_per_s:.1f}/s ({c.result.success_rate:.1%} success), {latency(c)}"
        for c in (found[i] for i in front)
    ]
    notes = ["On the front: " + "; ".join(on) + "."]
    off = [c for i, c in enumerate(found) if i not in front and not c.on_time]
    if off:
        listed = "; ".join(f"{name(c)} ({c.result.success_rate:.1%} success)" for c in off)
        notes.append(
            "Hollow: a run that failed more than 1% of its requests. Its 99th-percentile "
            "caller never got an answer, so the p99 of its successes is not what its callers "
            "saw: it can be on the front only by out-doing every run's goodput. Kept off the "
            f"front so: {listed}."
        )
    notes.append(
        "Goodput: requests that succeeded and met every objective, per second of the "
        "rates' window (the offered window, the makespan or the lower bound, the longest)."
    )
    return notes

"""A run's timeline in the HTML report: one panel per series, one line per strategy.

What it draws, and what it leaves out so that nothing misleads at a glance:

- in flight: the server's count of requests executing (its stats, with its
  ``max_inflight``) when every strategy had the server's counters, else the
  client's (attempts its Gate has sent and not yet seen answered); yields and
  completed requests, cumulative; failed requests, cumulative;
- every other numeric series of the timeline (the scraped queue, running and KV
  cache, the server's memory, a series added later), a panel each;
- a panel whose every value, for every strategy, is zero (or missing) is not
  drawn: a note under the plot says so (an empty queue is "no queueing
  observed", not a flat line on a +-0.04 axis);
- the scraped "running" of the server the tool started itself is the same
  gauge (``yieldgate_inflight``) as the server's in flight, read at the same
  moment from its metrics: it is not drawn twice, and the note says why;
- a gauge (in flight, queue, running, memory) breaks where no sample was taken
  for more than three sampling intervals, rather than holding its last value
  across a time nobody looked;
- every axis starts at zero (counts and memory alike), so noise in a flat
  series never looks like growth;
- each strategy keeps its colour, dash pattern and marker (``plot_styles``)
  in every panel, drawn in the report's order.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from yieldgate.burst._html_plots import (
    _figure,
    _legend,
    _mpl,
    _num,
    _render,
    flatten,
    plot_styles,
    zero_based,
)
from yieldgate.burst._results import BurstReport, StrategyResult

__all__ = ["timeline_figure", "timeline_plot"]

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
# What a panel left out because it was zero throughout means, for the known series.
_ZERO_NOTES = {
    "scraped_queue": "queue (scraped): no queueing observed (0 throughout)",
    "failed": "requests failed: none",
}


def _point_dicts(r: StrategyResult) -> list[dict[str, Any]]:
    return [flatten(p.as_dict()) for p in r.timeline]


def _extra_series(points: Sequence[Sequence[Mapping[str, Any]]]) -> list[str]:
    """Numeric timeline fields beyond the known ones (a scraped series, say), in order."""
    seen: dict[str, None] = {}
    for mine in points:
        for point in mine:
            for key, value in point.items():
                if key not in _POINT_KEYS and _num(value):
                    seen.setdefault(key)
    return list(seen)


def _values(points: Sequence[Mapping[str, Any]], key: str, scale: float) -> list[float]:
    values: list[Any] = [p.get(key) for p in points]
    return [v * scale if _num(v) else math.nan for v in values]


# Series that count since the start (the rest are gauges, read at each sample).
_CUMULATIVE = frozenset({"client_yields", "server_yielded", "completed", "failed"})
# A gauge's line breaks where no sample was taken for this many sampling intervals.
_GAP_INTERVALS = 3


def _broken(t: list[float], ys: list[float], gap_s: float) -> tuple[list[float], list[float]]:
    """``(t, ys)`` with a break (``nan``) one interval after any sample followed by none for
    more than ``gap_s``: a gauge's value is known when read, not until the next reading."""
    bt: list[float] = []
    bys: list[float] = []
    for i, (x, y) in enumerate(zip(t, ys, strict=True)):
        bt.append(x)
        bys.append(y)
        if i + 1 < len(t) and t[i + 1] - x > gap_s:
            bt.append(x + gap_s / _GAP_INTERVALS)
            bys.append(math.nan)
    return bt, bys


class _Panel:
    """One panel: its title, and per strategy label its ``(t, values)``."""

    def __init__(self, key: str, title: str) -> None:
        self.key, self.title = key, title
        self.lines: dict[str, tuple[list[float], list[float]]] = {}
        self.gaps = False

    @property
    def empty(self) -> bool:
        return not any(v for _, ys in self.lines.values() for v in ys if not math.isnan(v))


def _panels(report: BurstReport, server: bool) -> list[_Panel]:
    where = "server" if server else "client"
    points = {r.label: _point_dicts(r) for r in report.results}
    keys = [
        ("server_inflight" if server else "client_inflight", f"in flight ({where})"),
        ("server_yielded" if server else "client_yields", f"yields, cumulative ({where})"),
        ("completed", "requests completed, cumulative"),
        ("failed", "requests failed, cumulative"),
    ]
    extras = _extra_series(list(points.values()))[:_MAX_EXTRA_SERIES]
    keys += [(key, _SERIES_TITLES.get(key, key)) for key in extras]
    interval: Any = report.config.get("sample_interval_s")
    gap_s = _GAP_INTERVALS * (interval if _num(interval) and interval > 0 else 0.1)
    panels = []
    for key, title in keys:
        panel = _Panel(key, title)
        for label, mine in points.items():
            if mine:
                scale = _SERIES_SCALE.get(key, 1.0)
                t, ys = [p["t_s"] for p in mine], _values(mine, key, scale)
                if key not in _CUMULATIVE:
                    t, ys = _broken(t, ys, gap_s)
                    panel.gaps = panel.gaps or len(t) > len(mine)
                panel.lines[label] = (t, ys)
        panels.append(panel)
    return panels


def _same_gauge(report: BurstReport, server: bool) -> bool:
    """Whether "running (scraped)" is the in-flight panel's own count read again: the
    server's counters are drawn, and what was scraped is the server the tool started
    (no ``--scrape URL`` named another)."""
    return server and report.config.get("scrape") is None


def _caption(report: BurstReport, server: bool, dropped: Sequence[str], gaps: bool) -> list[str]:
    if server:
        notes = [
            "In flight (server): the requests the server was executing at each sample, from "
            "its stats; the dashed line is its max_inflight."
        ]
    else:
        notes = [
            "In flight (client): the attempts the client's Gate had sent and not yet seen "
            "answered at each sample. A baseline's Gate is a pass-through, so for it this is "
            "every request on the wire, whether the server runs it, queues it or has yet to "
            "refuse it."
        ]
        if any(p.scraped_running is not None for r in report.results for p in r.timeline):
            notes.append(
                "Running (scraped): what the server's metrics say it is executing. In flight "
                "minus running is what waits in the server's queue or on the way."
            )
    if dropped:
        notes.append("Not drawn: " + "; ".join(dropped) + ".")
    if gaps:
        notes.append(
            f"A gap in a line of the in flight, queue, running or memory panels: no sample for "
            f"more than {_GAP_INTERVALS} sampling intervals (the sampler shares the client's "
            "event loop, which the burst kept busy); what the count was meanwhile is unknown."
        )
    notes.append(
        "Each strategy keeps its colour, dash pattern and marker in every panel; "
        "every axis starts at zero."
    )
    return notes


def timeline_plot(
    report: BurstReport, colors: Mapping[str, str], prefix: str
) -> tuple[str, list[str]]:
    """The timeline as inline SVG, and the notes that go under it."""
    fig, notes = timeline_figure(report, colors)
    return _render(fig, prefix), notes


def timeline_figure(report: BurstReport, colors: Mapping[str, str]) -> tuple[Any, list[str]]:
    """The timeline's matplotlib figure, one panel an axis, and the notes under it."""
    results = report.results
    server = bool(results) and all(
        r.timeline and r.timeline[0].server_inflight is not None for r in results
    )
    drawn: list[_Panel] = []
    dropped: list[str] = []
    for i, panel in enumerate(_panels(report, server)):
        if panel.key == "scraped_running" and _same_gauge(report, server) and not panel.empty:
            dropped.append(
                "running (scraped): the server's yieldgate_inflight, the count that in flight "
                "(server) shows, read from its metrics at the same moment as its stats (any "
                "difference is the count changing between the two replies)"
            )
        elif i in (0, 2) or not panel.empty:
            drawn.append(panel)
        elif panel.lines:
            title = _SERIES_TITLES.get(panel.key, panel.key)
            dropped.append(_ZERO_NOTES.get(panel.key, f"{title}: 0 throughout"))
    styles = plot_styles(colors)
    fig, axes = _figure(len(drawn), 2.1 * len(drawn) + 0.4)
    for ax, panel in zip(axes, drawn, strict=True):
        for label, (t, ys) in panel.lines.items():
            st = styles[label]
            kwargs = {
                "c": st["color"],
                "ls": st["ls"],
                "lw": st["lw"],
                "marker": st["marker"],
                "ms": 5,
                "markevery": max(1, len(t) // 8),
                "zorder": st["zorder"],
                "label": _mpl(label) if ax is axes[0] else None,
            }
            if panel.key.endswith("inflight"):
                ax.step(t, ys, where="post", **kwargs)
            else:
                ax.plot(t, ys, **kwargs)
        ax.set_title(_mpl(panel.title), loc="left")
        values = [v for _, ys in panel.lines.values() for v in ys if not math.isnan(v)]
        if all(v >= 0 for v in values):
            zero_based(ax, max(values, default=0.0))
    caps = {r.server.max_inflight for r in results if r.server is not None}
    if server and len(caps) == 1:
        cap = caps.pop()
        axes[0].axhline(cap, color="grey", ls="--", lw=1, label="max_inflight")
        zero_based(axes[0], max(cap, axes[0].get_ylim()[1] / 1.1))
    _legend(axes[0], "outside")
    axes[-1].set_xlabel("seconds since the first arrival")
    return fig, _caption(report, server, dropped, any(p.gaps for p in drawn))

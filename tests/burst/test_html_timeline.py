"""The report's timeline: empty series not drawn, axes from zero, every strategy's line
distinguishable, and the two counts of work in flight explained."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from tests.burst.test_rates import counters
from yieldgate.burst import BurstReport, Slo, TimelinePoint
from yieldgate.burst._html import html_report
from yieldgate.burst._html_plots import plot_colors
from yieldgate.burst._html_timeline import timeline_figure
from yieldgate.burst._results import summarise
from yieldgate.burst._targets import Request

MIB = 2**20


def _timeline(*, server: bool, rss_mib: float, failed: int = 0) -> list[TimelinePoint]:
    """A run as the sampler records it against a server the tool started, over HTTP: the
    scraped queue stays empty, the memory moves by a few hundredths of a MiB."""
    return [
        TimelinePoint(
            t_s=0.1 * k,
            client_inflight=8 if k < 9 else 0,
            client_attempts=4 * k,
            client_yields=k,
            completed=4 * k,
            failed=failed if k == 9 else 0,
            server_inflight=(8 if k < 9 else 0) if server else None,
            server_executed=4 * k if server else None,
            server_yielded=k if server else None,
            scraped_queue=0.0,
            scraped_running=8.0 if 0 < k < 9 else 0.0,
            server_rss_bytes=int((rss_mib + 0.01 * (k % 3)) * MIB),
        )
        for k in range(10)
    ]


def _report(*, server: bool, scrape: str | None = None) -> BurstReport:
    results = []
    for name in ("yieldgate", "tenacity"):
        requests = [Request(index=i, arrival_s=0.0, end_s=0.9, ok=True) for i in range(36)]
        results.append(
            summarise(
                strategy=name,
                label=name,
                requests=requests,
                attempts=36,
                yields=9,
                slo=Slo(),
                stream=False,
                server=counters(executed=36, exec_ms=200.0, max_inflight=8) if server else None,
                # Both strategies did exactly the same: their lines lie on each other.
                timeline=_timeline(server=server, rss_mib=49.7),
            )
        )
    return BurstReport(
        config={
            "scenario": "timeline",
            "target": "openai+http://",
            "requests": 36,
            "profile": {"spec": "all-at-once"},
            "scrape": scrape,
        },
        machine={},
        created="2026-01-01T00:00:00+00:00",
        results=tuple(results),
    )


def _panels(report: BurstReport) -> tuple[dict[str, Any], list[str]]:
    fig, notes = timeline_figure(report, plot_colors(r.label for r in report.results))
    return {ax.get_title(loc="left"): ax for ax in fig.axes}, notes


def test_an_all_zero_series_is_not_drawn_and_the_note_says_so() -> None:
    panels, notes = _panels(_report(server=True))
    assert "queue (scraped)" not in panels
    assert "requests failed, cumulative" not in panels  # none failed
    text = " ".join(notes)
    assert "queue (scraped): no queueing observed (0 throughout)" in text
    assert "requests failed: none" in text
    assert "in flight (server)" in panels


def test_memory_and_every_other_axis_start_at_zero() -> None:
    panels, _ = _panels(_report(server=True))
    memory = panels["server memory (RSS), MiB"]
    low, high = memory.get_ylim()
    assert low == 0
    assert 49.72 <= high < 60  # the flat 49.7 MiB shows as flat, not as growth
    for title, ax in panels.items():
        assert ax.get_ylim()[0] == 0, title


def test_overlapping_strategies_keep_their_own_dashes_and_markers_in_every_panel() -> None:
    panels, _ = _panels(_report(server=True))
    styles: dict[str, set[tuple[Any, ...]]] = {}
    for ax in panels.values():
        lines = [line for line in ax.get_lines() if line.get_marker() not in (None, "None", "")]
        assert len(lines) == 2  # one line per strategy (the max_inflight rule has no marker)
        first, second = lines
        assert first.get_linestyle() != second.get_linestyle()
        assert first.get_marker() != second.get_marker()
        assert first.get_linewidth() > second.get_linewidth()  # the one beneath shows its edges
        assert first.get_zorder() < second.get_zorder()  # drawn in the report's order
        for key, line in (("yieldgate", first), ("tenacity", second)):
            styles.setdefault(key, set()).add(
                (line.get_color(), line.get_linestyle(), line.get_marker())
            )
    assert all(len(kinds) == 1 for kinds in styles.values())  # the same in every panel


def test_the_scraped_running_of_the_started_server_is_not_drawn_twice() -> None:
    panels, notes = _panels(_report(server=True))
    assert "running (scraped)" not in panels
    assert "the server's yieldgate_inflight, the count that in flight (server) shows" in " ".join(
        notes
    )
    # Another server named with --scrape is another count: drawn.
    panels, _ = _panels(_report(server=True, scrape="http://vllm:8000/metrics"))
    assert "running (scraped)" in panels


def test_the_clients_in_flight_and_the_servers_running_are_explained() -> None:
    panels, notes = _panels(_report(server=False))
    assert {"in flight (client)", "running (scraped)"} <= set(panels)
    text = " ".join(notes)
    assert "In flight (client): the attempts the client's Gate had sent" in text
    assert "In flight minus running is what waits in the server's queue" in text
    page = html_report(_report(server=False))
    assert "In flight minus running is what waits in the server&#x27;s queue" in page


def test_a_gauge_breaks_where_no_sample_was_taken() -> None:
    report = _report(server=True)
    gappy = []
    for r in report.results:
        # Samples at 0.0 and 0.1 s, then none until 0.8 s (a busy loop), then 0.9 s.
        points = [p for p in r.timeline if not 0.15 < p.t_s < 0.75]
        gappy.append(dataclasses.replace(r, timeline=tuple(points)))
    report = dataclasses.replace(
        report, results=tuple(gappy), config={**report.config, "sample_interval_s": 0.1}
    )
    panels, notes = _panels(report)
    inflight = [line for line in panels["in flight (server)"].get_lines() if line.get_marker()]
    xs = list(inflight[0].get_xdata())
    ys = list(inflight[0].get_ydata())
    gap = next(i for i, y in enumerate(ys) if math.isnan(y))
    assert xs[gap - 1] == pytest.approx(0.1)  # the last reading before the gap
    assert xs[gap] == pytest.approx(0.2)  # held for one interval, then no line
    completed = panels["requests completed, cumulative"].get_lines()[0]
    assert not any(math.isnan(y) for y in completed.get_ydata())  # a count is not a gauge
    assert any("no sample for more than 3 sampling intervals" in n for n in notes)

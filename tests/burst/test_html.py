"""The HTML report: every plot embedded, nothing fetched, every string escaped."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from tests.burst.test_report import _report
from yieldgate.burst import (
    BurstReport,
    Slo,
    StrategyResult,
    Sweep,
    SweepReport,
    TimelinePoint,
    write_html,
)
from yieldgate.burst._html import html_report
from yieldgate.burst._html_plots import pareto_front
from yieldgate.burst._results import summarise
from yieldgate.burst._targets import Request

_URL_ATTRS = {"src", "href", "xlink:href", "srcset", "action", "formaction", "poster", "data"}
_EMBEDS = {"iframe", "embed", "object", "frame", "base"}


def _local(ref: str) -> bool:
    ref = ref.strip().strip("'\"").lower()
    return ref.startswith(("#", "data:"))


def _css_problems(css: str) -> list[str]:
    problems = [f"@import in CSS: {css[:60]!r}"] if "@import" in css.lower() else []
    for ref in re.findall(r"url\(([^)]*)\)", css, flags=re.IGNORECASE):
        if not _local(ref):
            problems.append(f"url({ref}) in CSS")
    return problems


class _Page(HTMLParser):
    """What a browser would load from the page, and which plot holds which image."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.problems: list[str] = []
        self.scripts = 0
        self.figure: str | None = None
        self.images: dict[str, int] = {}  # plot id -> <svg> and data: <img> inside it
        self.ids: list[str] = []
        self.in_style = False
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if "id" in a:
            self.ids.append(a["id"])
        for name, value in a.items():
            if name in _URL_ATTRS and not _local(value):
                self.problems.append(f"<{tag} {name}={value!r}>")
        if "style" in a:
            self.problems += _css_problems(a["style"])
        if tag == "link" and "stylesheet" in a.get("rel", "").lower():
            self.problems.append(f"<link rel=stylesheet href={a.get('href')!r}>")
        if tag == "meta" and a.get("http-equiv", "").lower() == "refresh":
            self.problems.append("<meta http-equiv=refresh>")
        if tag in _EMBEDS:
            self.problems.append(f"<{tag}>")
        if tag == "script":
            self.scripts += 1
        if tag == "style":
            self.in_style = True
        if tag == "figure" and "plot" in a.get("class", "").split():
            self.figure = a.get("id", "")
            self.images[self.figure] = 0
        is_image = tag == "svg" or (tag == "img" and a.get("src", "").startswith("data:image/"))
        if is_image and self.figure is not None:
            self.images[self.figure] += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "figure":
            self.figure = None
        if tag == "style":
            self.in_style = False

    def handle_data(self, data: str) -> None:
        if self.in_style:
            self.problems += _css_problems(data)
        self.text.append(data)


def parse_page(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def network_references(text: str) -> list[str]:
    """Everything in an HTML page that would make a browser fetch something."""
    return parse_page(text).problems


def plot_images(text: str) -> dict[str, int]:
    """Each plot's id, with the images (inline <svg> or data: <img>) it holds."""
    return parse_page(text).images


def _sweep(burst: BurstReport) -> SweepReport:
    return SweepReport(
        sweep=Sweep.parse("rate=1,2"),
        config={**burst.config, "serve_args": ["--max-inflight", "2"]},
        machine={"cpus": 2, "platform": "test"},
        created=burst.created,
        points=((1.0, burst), (2.0, burst)),
    )


def test_a_burst_report_embeds_its_plots_and_tables() -> None:
    text = html_report(_report(with_server=True))
    assert plot_images(text) == {"plot-timeline": 1, "plot-pareto": 1}
    assert network_references(text) == []
    page = parse_page(text)
    assert page.scripts == 0
    body = " ".join(page.text)
    for needle in (
        "attempts / request",
        "1.67 (5)",  # the terminal table's figures
        "YieldExhaustedError 2",
        "TTFT p50/p95/p99 ms",
        "server yields by reason",
        "saturated 2",
        "tokens/s",
        "Goodput: TPOT <= 100 ms",
        "success 100.0% (goal >= 100%)",
        "tcp://127.0.0.1:1",  # the config
        "in flight (server)",  # text of the SVG, kept as text
        # naive failed 2 of 3: however fast its one success, yieldgate's goodput beats it.
        "On the front: yieldgate: 6.7/s (100.0% success), p99 0.3 s.",
        "Kept off the front so: naive (33.3% success).",
    ):
        assert needle in body, needle
    assert {"config", "machine", "goal"} <= set(page.ids)


def test_a_sweep_report_embeds_every_plot_and_a_timeline_per_point() -> None:
    text = html_report(_sweep(_report(with_server=False)))
    assert plot_images(text) == {
        "plot-latency": 1,
        "plot-goodput": 1,
        "plot-pareto": 1,
        "plot-timeline-1": 1,
        "plot-timeline-2": 1,
    }
    assert network_references(text) == []
    page = parse_page(text)
    body = " ".join(page.text)
    assert "time to first token (solid p50, dashed p99)" in body  # streamed: a TTFT panel
    assert "in flight (client)" in body  # no server counters: the client's
    assert "rate=1,2" in body
    # Every id in the page is unique: the SVGs' own ids are prefixed by their plot's.
    assert len(page.ids) == len(set(page.ids))


def test_a_long_sweep_shows_the_last_timeline_only() -> None:
    burst = _report(with_server=False)
    values = tuple(float(v) for v in range(1, 15))
    sweep = SweepReport(
        sweep=Sweep(axis="concurrency", values=values),
        config=burst.config,
        machine={},
        created=burst.created,
        points=tuple((v, burst) for v in values),
    )
    images = plot_images(html_report(sweep))
    assert [k for k in images if k.startswith("plot-timeline")] == ["plot-timeline-14"]


def test_strings_from_outside_are_escaped_everywhere(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script> $a$ & "q"'
    burst = _report(with_server=True)
    results = tuple(dataclasses.replace(r, label=f"{r.label} {evil}") for r in burst.results)
    burst = dataclasses.replace(
        burst,
        results=results,
        config={**burst.config, "target": f"openai+http://h/{evil}", "model": evil},
        machine={"platform": evil},
    )
    for report in (burst, _sweep(burst)):
        out = write_html(report, tmp_path / "sub" / "r.html")
        text = out.read_text(encoding="utf-8")
        page = parse_page(text)
        assert page.scripts == 0
        assert "<script" not in text.lower()
        assert network_references(text) == []
        body = " ".join(page.text)
        assert f"yieldgate {evil}" in body  # shown, as text (in the tables and the SVG legend)
        assert f"openai+http://h/{evil}" in body


def test_no_success_and_no_timeline_still_render() -> None:
    requests = [Request(index=0, arrival_s=0.0, end_s=0.1, ok=False)]
    requests[0].error = "HTTP 503"
    result = summarise(
        strategy="naive",
        label="naive",
        requests=requests,
        attempts=1,
        yields=0,
        slo=Slo(),
        stream=False,
        server=None,
        timeline=[],
    )
    report = dataclasses.replace(_report(with_server=False), results=(result,))
    text = html_report(report)
    assert plot_images(text) == {"plot-timeline": 1, "plot-pareto": 1}
    assert "No run succeeded." in text
    assert "HTTP 503" in text


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _ScrapedPoint(TimelinePoint):
    """A timeline point with series added later (scraped from the server, say)."""

    scraped: Mapping[str, float | None] = dataclasses.field(default_factory=dict)
    queue_len: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {**TimelinePoint.as_dict(self), "scraped": dict(self.scraped), "queue_len": None}


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _MoreFigures(StrategyResult):
    """A result with figures added later."""

    recovery_s: float | None = None

    def as_dict(self, *, timeline: bool = True) -> dict[str, Any]:
        return {
            **StrategyResult.as_dict(self, timeline=timeline),
            "recovery_s": self.recovery_s,
            "stall": {"p50_ms": 12.5, "within_20pct": 0.75},
        }


def test_fields_added_later_are_shown_not_a_failure() -> None:
    burst = _report(with_server=True)
    results = []
    for r in burst.results:
        timeline = tuple(
            _ScrapedPoint(
                **{f.name: getattr(p, f.name) for f in dataclasses.fields(TimelinePoint)},
                scraped={"vllm:num_requests_waiting": float(k), "kv_cache_use": None},
            )
            for k, p in enumerate(r.timeline)
        )
        fields = {f.name: getattr(r, f.name) for f in dataclasses.fields(StrategyResult)}
        results.append(_MoreFigures(**{**fields, "timeline": timeline}, recovery_s=1.25))
    text = html_report(dataclasses.replace(burst, results=tuple(results)))
    assert network_references(text) == []
    body = " ".join(parse_page(text).text)
    # A numeric series gets its own panel; one with no number (all None) none.
    assert "scraped.vllm:num_requests_waiting" in body
    assert "scraped.kv_cache_use" not in body
    assert "queue_len" not in body
    for needle in (
        "recovery_s",
        "1.25",
        "stall.p50_ms",
        "12.5",
        "stall.within_20pct",
    ):
        assert needle in body, needle


@pytest.mark.parametrize(
    ("points", "front"),
    [
        ([], []),
        ([(1.0, 10.0)], [0]),
        # (latency, throughput): 1 is beaten by 0 (as fast, more throughput); 3 ties 2.
        ([(1.0, 10.0), (1.0, 5.0), (2.0, 20.0), (2.0, 20.0), (3.0, 15.0)], [0, 2, 3]),
        ([(3.0, 30.0), (2.0, 20.0), (1.0, 10.0)], [2, 1, 0]),
    ],
)
def test_pareto_front(points: list[tuple[float, float]], front: list[int]) -> None:
    assert pareto_front(points) == front


def test_the_network_check_catches_what_it_should() -> None:
    bad = (
        '<img src="https://x/a.png"><script src="//cdn/x.js"></script>'
        '<link rel="stylesheet" href="s.css"><div style="background:url(http://x/b)"></div>'
        "<style>@import 'y.css'; p{background:url('https://z')}</style>"
        '<svg><use xlink:href="http://x#m"/></svg>'
    )
    assert len(network_references(bad)) == 8
    fine = (
        '<svg><use xlink:href="#m"/><path clip-path="url(#p)"/></svg>'
        '<img src="data:image/png;base64,AA">'
    )
    assert network_references(fine) == []

"""The buffering presets: one burst against a queueing server and a governed one."""

from __future__ import annotations

import pytest

from yieldgate.burst import PRESETS, BurstConfig
from yieldgate.burst._compare import run_comparison
from yieldgate.burst._presets import COMPARISONS

pytestmark = pytest.mark.e2e


def test_buffering_and_governed_differ_only_in_the_queue() -> None:
    buffering, governed = PRESETS["buffering"], PRESETS["buffering-governed"]
    assert buffering["serve_args"] == (*governed["serve_args"], "--queue", "unbounded")
    for key in ("target", "requests", "profile", "strategies", "slo", "timeout_s"):
        assert buffering[key] == governed[key]


def test_the_buffering_comparison_runs_as_one_report() -> None:
    # Smaller than the preset, for a busy machine, and without the 1 s time-out (a
    # loaded machine would turn it into noise); the same servers and strategies.
    parts = [
        (
            label,
            BurstConfig(
                **{
                    **PRESETS[name],
                    "requests": 120,
                    "sample_interval_s": 0.05,
                    "timeout_s": None,
                }
            ),
        )
        for label, name in COMPARISONS["buffering-vs-governed"]
    ]
    report = run_comparison(parts, name="buffering-vs-governed")
    assert report.config["scenario"] == "buffering-vs-governed"
    assert [p["label"] for p in report.config["parts"]] == ["buffering", "governed"]
    by_label = {r.label: r for r in report.results}
    strategies = ("naive", "openai-default", "yieldgate")
    assert list(by_label) == [f"{p}: {s}" for p in ("buffering", "governed") for s in strategies]
    for name in strategies:
        result = by_label[f"buffering: {name}"]
        # Buffered: nothing is refused, so every client succeeds at its first attempt.
        assert result.success_rate == 1.0
        assert result.attempts == result.requests
        assert result.server is not None
        assert result.server.delta["yielded"] == 0
        assert result.hint_accuracy is not None
        assert result.hint_accuracy.hints == 0
        # The tool started the server: its memory is sampled, its queue scraped.
        assert result.server_rss_peak_bytes is not None
        assert result.server_rss_peak_bytes > 10 * 2**20
        assert any(p.scraped_queue for p in result.timeline)
    # Governed: naive clients meet the refusals; yieldgate's waits serve everyone.
    governed = {name: by_label[f"governed: {name}"] for name in strategies}
    assert governed["yieldgate"].success_rate == 1.0
    assert governed["naive"].succeeded + governed["naive"].failed == 120
    assert governed["naive"].server is not None
    assert governed["naive"].server.delta["yielded"] > 0
    naive_hints = governed["naive"].hint_accuracy
    assert naive_hints is not None
    assert naive_hints.hints == governed["naive"].yields > 0
    assert all(not p.scraped_queue for p in governed["naive"].timeline)

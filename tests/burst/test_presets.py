"""The buffering presets: one burst against a queueing server and a governed one."""

from __future__ import annotations

import pytest

from yieldgate.burst import PRESETS, BurstConfig, run_burst

pytestmark = pytest.mark.e2e


def test_buffering_and_governed_differ_only_in_the_queue() -> None:
    buffering, governed = PRESETS["buffering"], PRESETS["buffering-governed"]
    assert buffering["serve_args"] == (*governed["serve_args"], "--queue", "unbounded")
    for key in ("target", "requests", "profile", "strategies", "slo"):
        assert buffering[key] == governed[key]


def test_the_buffering_comparison_runs() -> None:
    # Smaller than the preset, for a busy machine; the same servers and strategies.
    reports = {
        name: run_burst(
            BurstConfig(**{**PRESETS[name], "requests": 120, "sample_interval_s": 0.05})
        )
        for name in ("buffering", "buffering-governed")
    }
    queued = {r.label: r for r in reports["buffering"].results}
    governed = {r.label: r for r in reports["buffering-governed"].results}
    assert set(queued) == set(governed) == {"naive", "openai-default", "yieldgate"}
    for result in queued.values():
        # Buffered: nothing is refused, so every client succeeds at its first attempt.
        assert result.success_rate == 1.0
        assert result.attempts == result.requests
        assert result.server is not None
        assert result.server.delta["yielded"] == 0
    # Governed: naive clients meet the refusals; yieldgate's waits serve everyone.
    assert governed["yieldgate"].success_rate == 1.0
    assert governed["naive"].succeeded + governed["naive"].failed == 120
    assert governed["naive"].server is not None
    assert governed["naive"].server.delta["yielded"] > 0

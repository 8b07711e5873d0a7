"""Named scenarios: the seed's cold start, the saturated burst, the demo."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yieldgate
from yieldgate.burst._profiles import ArrivalProfile
from yieldgate.burst._results import Goal, Slo
from yieldgate.burst._strategies import STRATEGY_NAMES, Strategy
from yieldgate.burst._targets import Workload

__all__ = ["COLD_START_RAMP", "PRESETS", "demo_settings"]

_ALL = tuple(Strategy(name=name) for name in STRATEGY_NAMES)

#: The cold-start preset plus a rate cap that ramps 1 -> 20 attempt starts/s
#: over 5 s (restarted by every ``cold_start`` outcome). It assumes the
#: backend's throughput is known (8 slots of 500 ms: 16/s).
COLD_START_RAMP = Strategy(
    name="yieldgate",
    policy=replace(
        yieldgate.GatePolicy.cold_start(),
        rate=yieldgate.RatePolicy(per_s=20, ramp_from_per_s=1, ramp_s=5),
    ),
    policy_label="cold_start + rate ramp",
)

#: ``BurstConfig`` keyword arguments per scenario; command-line flags override them.
PRESETS: Mapping[str, Mapping[str, Any]] = {
    # Seed 001: a backend that answers 503 "loading" for 2 s, then ramps its
    # capacity from 1 to 8 slots over 5 s; the HuggingFace route says so with
    # `estimated_time`, as the Inference API does.
    "cold-start": {
        "scenario": "cold-start",
        "target": "hf+http://",
        "serve_args": (
            "--cold-start-s",
            "2",
            "--ramp-s",
            "5",
            "--max-inflight",
            "8",
            "--exec-ms",
            "500",
        ),
        "requests": 100,
        "profile": ArrivalProfile.all_at_once(),
        "strategies": (_ALL[0], COLD_START_RAMP, *_ALL[1:]),
        "goal": Goal(min_success_rate=1.0, max_attempts_per_request=1.5),
    },
    # bench/burst_efficiency.py's scenario: a warm server, 8 slots, 50 ms each.
    "saturated": {
        "scenario": "saturated",
        "target": "tcp://",
        "serve_args": ("--max-inflight", "8", "--exec-ms", "50"),
        "requests": 400,
        "profile": ArrivalProfile.all_at_once(),
        "strategies": _ALL,
        "goal": Goal(min_success_rate=1.0, max_attempts_per_request=2.0, max_makespan_ratio=1.25),
    },
}


def demo_settings(*, requests: int = 160, max_inflight: int = 8) -> dict[str, Any]:
    """``make demo``: the disaggregated harness (a real, tiny model with one prefill
    worker) meets a burst of streamed requests, a quarter of them long prompts."""
    return {
        "scenario": "demo",
        "target": "tcp://",
        "serve_args": (
            "--backend",
            "harness",
            "--prefill-workers",
            "1",
            "--max-inflight",
            str(max_inflight),
        ),
        "requests": requests,
        "profile": ArrivalProfile.all_at_once(),
        "strategies": tuple(Strategy(name=n) for n in ("yieldgate", "naive", "tenacity")),
        "workload": Workload(stream=True, prompt_tokens=((32, 0.75), (320, 0.25)), max_tokens=32),
        "slo": Slo(tpot_ms=100.0),
        "wait_ready": True,
        "goal": Goal(min_success_rate=1.0, max_attempts_per_request=2.0),
    }

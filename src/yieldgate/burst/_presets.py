"""Named scenarios: the seed's cold start, the saturated burst, a provider quota, buffering
against governing, the demo."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yieldgate
from yieldgate.burst._profiles import ArrivalProfile
from yieldgate.burst._results import Goal, Slo
from yieldgate.burst._strategies import Strategy, compared_names
from yieldgate.burst._targets import Workload

__all__ = ["COLD_START_RAMP", "COMPARISONS", "PRESETS", "demo_settings", "quota_cost"]

# What every preset compares: none of them targets anthropic+http://.
_ALL = tuple(Strategy(name=name) for name in compared_names("openai"))

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


def quota_cost(workload: Workload, requests: int, seed: int = 0) -> int:
    """The tokens a burst costs against ``yieldgate serve --quota-tpm`` as chat completions.

    Each request costs its prompt as the server reads it (``"user: "`` and the
    content: about 4 characters a token, rounded up) plus its ``max_tokens``
    (the server's default of 16 when the workload names none).
    """
    output = 16 if workload.max_tokens is None else workload.max_tokens
    prompts = workload.prompts(requests, seed)
    return sum(math.ceil(len(f"user: {prompt}") / 4) + output for prompt in prompts)


# The quota preset: 120 chat requests of mixed sizes at once, costing 1.5 times
# the tokens per window, over a 4 s "minute" so that a rehearsal takes seconds.
_QUOTA_REQUESTS = 120
_QUOTA_WINDOW_S = 4
_QUOTA_WORKLOAD = Workload(
    prompt_tokens=((200, 0.5), (800, 0.3), (2400, 0.2)), max_tokens=64, model="gpt-4o"
)
_QUOTA_TPM = round(quota_cost(_QUOTA_WORKLOAD, _QUOTA_REQUESTS) / 1.5)

# Buffering against governing (issue 21): 8 slots of 50 ms serve 160 requests/s;
# 600 chat completions arrive at twice that (Poisson, about 1.9 s), so the same
# server either queues the excess (`--queue unbounded`, as vLLM and TGI do) or
# yields it. A client that gives up after 1 s is the goodput objective.
_BUFFERING_SERVER = ("--max-inflight", "8", "--exec-ms", "50")
_BUFFERING_STRATEGIES = tuple(
    Strategy(name=name) for name in ("naive", "openai-default", "yieldgate")
)


def _buffering(*, queue: str | None) -> dict[str, Any]:
    """The ``buffering`` scenario against ``yieldgate serve --queue QUEUE`` (``None``: governed,
    no queue): the same burst, strategies and objective either way."""
    serve_args = _BUFFERING_SERVER if queue is None else (*_BUFFERING_SERVER, "--queue", queue)
    return {
        "scenario": "buffering" if queue is not None else "buffering-governed",
        "target": "openai+http://",
        "serve_args": serve_args,
        "requests": 600,
        "profile": ArrivalProfile.poisson(320.0),
        "strategies": _BUFFERING_STRATEGIES,
        "slo": Slo(e2e_ms=1000.0),
        # Every client gives up after 1 s: a buffering server's queue then holds
        # work nobody waits for until it notices the client is gone.
        "timeout_s": 1.0,
    }


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
    # A provider's quota (issue 19): OpenAI's tokens-per-minute bucket, emulated
    # by `yieldgate serve --quota-tpm` with a 4 s window, meets a burst of chat
    # completions that costs 1.5 times the limit: a third of it must wait for
    # the bucket to refill. Token 429s carry no retry-after, only the message's
    # "Please try again in ...".
    "quota": {
        "scenario": "quota",
        "target": "openai+http://",
        "serve_args": (
            "--quota-tpm",
            str(_QUOTA_TPM),
            "--quota-window-s",
            str(_QUOTA_WINDOW_S),
            "--max-inflight",
            "64",
            "--exec-ms",
            "20",
        ),
        "requests": _QUOTA_REQUESTS,
        "profile": ArrivalProfile.all_at_once(),
        "strategies": _ALL,
        "workload": _QUOTA_WORKLOAD,
        "goal": Goal(min_success_rate=1.0),
    },
    # The buffering side and the governed side of one comparison (docs/burst.md).
    "buffering": _buffering(queue="unbounded"),
    "buffering-governed": _buffering(queue=None),
}
"""``BurstConfig`` keyword arguments per scenario (``--preset NAME``); flags override them."""


COMPARISONS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "buffering-vs-governed": (("buffering", "buffering"), ("governed", "buffering-governed")),
}
"""Presets run one after the other into one report (``--preset NAME``), each result
labelled ``PART: strategy``: ``(part label, preset name)`` pairs."""


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

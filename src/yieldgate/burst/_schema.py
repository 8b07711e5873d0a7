"""The JSON documents ``yieldgate burst --json`` writes, as JSON Schemas (draft 2020-12):
``SCHEMA`` for one burst, ``SWEEP_SCHEMA`` for a sweep (its points reuse the burst's parts).

docs/burst.md describes every field in prose; the tests check real output
against this schema.
"""

from __future__ import annotations

from typing import Any

from yieldgate.burst._results import SCHEMA_ID, SWEEP_SCHEMA_ID

__all__ = ["SCHEMA", "SWEEP_SCHEMA"]

_NUM = {"type": "number"}
_INT = {"type": "integer", "minimum": 0}
_NUM_OR_NULL = {"type": ["number", "null"]}
_INT_OR_NULL = {"type": ["integer", "null"]}
_COUNTS = {"type": "object", "additionalProperties": _INT}


def _obj(props: dict[str, Any], *, nullable: bool = False) -> dict[str, Any]:
    return {
        "type": ["object", "null"] if nullable else "object",
        "required": sorted(props),
        "properties": props,
    }


_PCT = _obj(
    {
        "count": _INT,
        "p50": _NUM_OR_NULL,
        "p95": _NUM_OR_NULL,
        "p99": _NUM_OR_NULL,
        "mean": _NUM_OR_NULL,
    }
)
_SLO = _obj({"ttft_ms": _NUM_OR_NULL, "tpot_ms": _NUM_OR_NULL, "e2e_ms": _NUM_OR_NULL})
_POINT = _obj(
    {
        "t_s": _NUM,
        "client_inflight": _INT,
        "client_attempts": _INT,
        "client_yields": _INT,
        "completed": _INT,
        "failed": _INT,
        "server_inflight": _INT_OR_NULL,
        "server_executed": _INT_OR_NULL,
        "server_yielded": _INT_OR_NULL,
        "scraped_queue": _NUM_OR_NULL,
        "scraped_running": _NUM_OR_NULL,
        "scraped_kv_cache": _NUM_OR_NULL,
        "server_rss_bytes": _INT_OR_NULL,
    }
)
_HINTS = _obj(
    {
        "hints": _INT,
        "resolved": _INT,
        "error_ms_p50": _NUM_OR_NULL,
        "error_ms_p90": _NUM_OR_NULL,
        "within": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
        "hint_ms_p50": _NUM_OR_NULL,
    },
    nullable=True,
)
_RECOVERY = _obj(
    {
        "yields_s": _NUM,
        "baseline_ms": _NUM_OR_NULL,
        "threshold_ms": _NUM_OR_NULL,
        "latency_s": _NUM_OR_NULL,
        "recovery_s": _NUM_OR_NULL,
        "probes": _INT,
    },
    nullable=True,
)
_PRIORITY = _obj(
    {
        "priority": {"enum": ["high", "normal", "low"]},
        "requests": _INT,
        "succeeded": _INT,
        "success_rate": {"type": "number", "minimum": 0, "maximum": 1},
        "latency_s_p50": _NUM_OR_NULL,
        "latency_s_p99": _NUM_OR_NULL,
        "jain": {"type": ["number", "null"], "minimum": 0, "maximum": 1},
    }
)
_SERVER = _obj(
    {
        "max_inflight": _INT,
        "exec_ms_ewma": _NUM_OR_NULL,
        "exec_ms_mean": _NUM_OR_NULL,
        "inflight_peak": _INT,
        "delta": _obj(
            {k: _INT for k in ("admitted", "executed", "failed", "cancelled", "yielded", "errors")}
        ),
        "yielded_by_reason": _COUNTS,
        "serving": {"type": ["object", "null"]},
    },
    nullable=True,
)
_RESULT = _obj(
    {
        "strategy": {
            "enum": ["yieldgate", "naive", "tenacity", "openai-default", "anthropic-default"]
        },
        "label": {"type": "string"},
        "requests": _INT,
        "succeeded": _INT,
        "failed": _INT,
        "success_rate": {"type": "number", "minimum": 0, "maximum": 1},
        "attempts": _INT,
        "attempts_per_request": _NUM,
        "yields": _INT,
        "errors_by_kind": _COUNTS,
        "makespan_s": _NUM,
        "lower_bound_s": _NUM_OR_NULL,
        "makespan_ratio": _NUM_OR_NULL,
        "offered_s": _NUM,
        "window_s": _NUM,
        "latency_s": _PCT,
        "streaming": _obj({"ttft_ms": _PCT, "tpot_ms": _PCT, "itl_ms": _PCT}, nullable=True),
        "throughput_per_s": _NUM,
        "output_tokens": _INT_OR_NULL,
        "tokens_per_s": _NUM_OR_NULL,
        "goodput": _obj({"slo": _SLO, "good": _INT, "ratio": _NUM, "per_s": _NUM}),
        "server": _SERVER,
        "timeouts": _INT,
        "hint_accuracy": _HINTS,
        "recovery": _RECOVERY,
        "priorities": {"type": "array", "items": _PRIORITY},
        "server_rss_peak_bytes": _INT_OR_NULL,
        "unreachable": {"type": ["string", "null"]},
        "complete": {"type": "boolean"},
        "timeline": {"type": "array", "items": _POINT},
    }
)

_CONFIG = _obj(
    {
        "scenario": {"type": ["string", "null"]},
        "target": {"type": "string"},
        "requests": _INT,
        "concurrency": _INT_OR_NULL,
        "profile": _obj(
            {
                "kind": {"enum": ["all-at-once", "poisson", "gamma", "ramp", "exp-ramp", "trace"]},
                "spec": {"type": "string"},
                "rate": _NUM_OR_NULL,
                "burstiness": _NUM_OR_NULL,
                "start_rate": _NUM_OR_NULL,
                "ramp_s": _NUM_OR_NULL,
                "trace_requests": _INT_OR_NULL,
            }
        ),
        "strategies": {"type": "array", "items": {"type": "string"}},
        "stream": {"type": "boolean"},
        "prompt_tokens": {"type": "array"},
        "max_tokens": _INT_OR_NULL,
        "model": {"type": "string"},
        "dialect": {"type": ["string", "null"]},
        "slo": _SLO,
        "serve_args": {"type": ["array", "null"], "items": {"type": "string"}},
        "fresh_server_per_strategy": {"type": "boolean"},
        "wait_ready": {"type": "boolean"},
        "seed": {"type": "integer"},
        "sample_interval_s": _NUM,
        "timeout_s": _NUM_OR_NULL,
        "priority_mix": {"type": "array", "items": {"type": "array"}},
        "scrape": {"type": ["string", "null"]},
        "recovery_probe_s": _NUM_OR_NULL,
        "workers": {"type": "integer", "minimum": 1},
    }
)
_MACHINE = _obj(
    {
        "cpus": _INT_OR_NULL,
        "platform": {"type": "string"},
        "machine": {"type": "string"},
        "python": {"type": "string"},
        "yieldgate": {"type": "string"},
    }
)
_GOAL = _obj(
    {
        "min_success_rate": _NUM,
        "max_attempts_per_request": _NUM_OR_NULL,
        "max_makespan_ratio": _NUM_OR_NULL,
    },
    nullable=True,
)
# A run cut short (docs/burst.md, "Interrupted runs"): why, and what it never finished.
_STOPPED = {
    "interrupted": {"type": "boolean"},
    "stopped_by": {"type": ["string", "null"]},
    "unfinished": {"type": "array", "items": {"type": "string"}},
}

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "yieldgate burst report",
    **_obj(
        {
            "schema": {"const": SCHEMA_ID},
            "created": {"type": "string"},
            "config": _CONFIG,
            "machine": _MACHINE,
            "goal": _GOAL,
            **_STOPPED,
            "results": {"type": "array", "items": _RESULT},
        }
    ),
}
"""The JSON Schema (draft 2020-12) of a burst report (``SCHEMA_ID``), for tools that check one."""

SWEEP_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SWEEP_SCHEMA_ID,
    "title": "yieldgate burst sweep",
    **_obj(
        {
            "schema": {"const": SWEEP_SCHEMA_ID},
            "created": {"type": "string"},
            "sweep": _obj(
                {
                    "axis": {"enum": ["rate", "concurrency"]},
                    "values": {"type": "array", "items": _NUM},
                    "spec": {"type": "string"},
                }
            ),
            "config": _CONFIG,
            "machine": _MACHINE,
            "interrupted": {"type": "boolean"},
            "stopped_by": {"type": ["string", "null"]},
            "unfinished_points": {"type": "array", "items": _NUM},
            "points": {
                "type": "array",
                "items": _obj(
                    {
                        "value": _NUM,
                        "config": _CONFIG,
                        "goal": _GOAL,
                        "unfinished": _STOPPED["unfinished"],
                        "results": {"type": "array", "items": _RESULT},
                    }
                ),
            },
        }
    ),
}
"""The JSON Schema of a sweep report (``SWEEP_SCHEMA_ID``)."""

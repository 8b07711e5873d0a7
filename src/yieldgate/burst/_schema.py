"""The JSON document ``yieldgate burst --json`` writes, as a JSON Schema (draft 2020-12).

docs/burst.md describes every field in prose; the tests check real output
against this schema.
"""

from __future__ import annotations

from typing import Any

from yieldgate.burst._results import SCHEMA_ID

__all__ = ["SCHEMA"]

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
        "strategy": {"enum": ["yieldgate", "naive", "tenacity", "openai-default"]},
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
        "latency_s": _PCT,
        "streaming": _obj({"ttft_ms": _PCT, "tpot_ms": _PCT, "itl_ms": _PCT}, nullable=True),
        "goodput": _obj({"slo": _SLO, "good": _INT, "ratio": _NUM, "per_s": _NUM}),
        "server": _SERVER,
        "timeline": {"type": "array", "items": _POINT},
    }
)

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": SCHEMA_ID,
    "title": "yieldgate burst report",
    **_obj(
        {
            "schema": {"const": SCHEMA_ID},
            "created": {"type": "string"},
            "config": _obj(
                {
                    "scenario": {"type": ["string", "null"]},
                    "target": {"type": "string"},
                    "requests": _INT,
                    "profile": _obj(
                        {
                            "kind": {"enum": ["all-at-once", "poisson", "gamma", "ramp"]},
                            "spec": {"type": "string"},
                            "rate": _NUM_OR_NULL,
                            "burstiness": _NUM_OR_NULL,
                            "start_rate": _NUM_OR_NULL,
                            "ramp_s": _NUM_OR_NULL,
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
                }
            ),
            "machine": _obj(
                {
                    "cpus": _INT_OR_NULL,
                    "platform": {"type": "string"},
                    "machine": {"type": "string"},
                    "python": {"type": "string"},
                    "yieldgate": {"type": "string"},
                }
            ),
            "goal": _obj(
                {
                    "min_success_rate": _NUM,
                    "max_attempts_per_request": _NUM_OR_NULL,
                    "max_makespan_ratio": _NUM_OR_NULL,
                },
                nullable=True,
            ),
            "results": {"type": "array", "items": _RESULT},
        }
    ),
}

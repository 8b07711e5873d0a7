"""Telemetry through opentelemetry-api, read back with the SDK's in-memory exporters."""

from __future__ import annotations

import random
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from yieldgate import (
    BreakerPolicy,
    Gate,
    GatePolicy,
    Outcome,
    RetriesExhaustedError,
    RetryPolicy,
    TransportError,
    WindowPolicy,
)
from yieldgate.gate import OtelInstrumentation

pytestmark = pytest.mark.anyio


@pytest.fixture
def otel() -> tuple[InMemorySpanExporter, InMemoryMetricReader, OtelInstrumentation]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    instr = OtelInstrumentation(tracer_provider=tracer_provider, meter_provider=meter_provider)
    return spans, reader, instr


def metrics(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = (point.count, point.sum)  # histogram
                    out.setdefault(metric.name, []).append((dict(point.attributes), value))
    return out


async def test_a_span_per_call_with_attempts_and_waits_as_events(otel: Any) -> None:
    spans, _, instr = otel
    g = Gate(GatePolicy(), name="svc", instrumentation=instr, rng=random.Random(1))
    steps = [Outcome.yielded(0.5, "saturated"), Outcome.ok("done")]

    async def attempt() -> Outcome:
        return steps.pop(0)

    assert await g.call(attempt, priority="high") == "done"
    (span,) = spans.get_finished_spans()
    assert span.name == "yieldgate.call"
    assert span.attributes["yieldgate.gate"] == "svc"
    assert span.attributes["yieldgate.priority"] == "high"
    assert span.attributes["yieldgate.attempts"] == 2
    assert span.attributes["yieldgate.outcome"] == "ok"
    events = [(e.name, dict(e.attributes)) for e in span.events]
    assert [name for name, _ in events] == ["attempt", "wait", "attempt"]
    assert events[0][1]["yieldgate.outcome"] == "yield"
    assert events[0][1]["yieldgate.reason"] == "saturated"
    assert events[0][1]["yieldgate.hint_s"] == 0.5
    assert events[1][1]["yieldgate.wait_s"] >= 0.5
    assert events[2][1]["yieldgate.outcome"] == "ok"


async def test_failed_calls_mark_the_span_as_error(otel: Any) -> None:
    spans, _, instr = otel
    g = Gate(GatePolicy(retry=RetryPolicy(max_attempts=2)), name="svc", instrumentation=instr)

    async def down() -> None:
        raise TransportError("reset")

    with pytest.raises(RetriesExhaustedError):
        await g.call(down)
    (span,) = spans.get_finished_spans()
    assert span.status.status_code.name == "ERROR"
    assert span.attributes["yieldgate.outcome"] == "RetriesExhaustedError"


async def test_metrics(otel: Any) -> None:
    _, reader, instr = otel
    g = Gate(
        GatePolicy(
            window=WindowPolicy(initial=1, max=4),
            breaker=BreakerPolicy(fail_max=1, reset_timeout_s=60),
            retry=RetryPolicy(max_attempts=1),
        ),
        name="svc",
        instrumentation=instr,
    )
    steps = [Outcome.yielded(0.1, "cold_start"), Outcome.ok(1)]

    async def attempt() -> Outcome:
        return steps.pop(0)

    async def fails() -> None:
        raise TransportError("x")

    async with anyio.create_task_group() as tg:
        tg.start_soon(g.call, attempt)
    with pytest.raises(RetriesExhaustedError):
        await g.call(fails)

    m = metrics(reader)
    attempts = {attrs["outcome"]: v for attrs, v in m["yieldgate.attempts"]}
    assert attempts == {"yield": 1, "ok": 1, "retryable": 1}
    assert m["yieldgate.yields"] == [({"yieldgate.gate": "svc", "reason": "cold_start"}, 1)]
    assert m["yieldgate.retries"] == [({"yieldgate.gate": "svc", "cause": "yield"}, 1)]
    ((_, (count, total)),) = m["yieldgate.wait.duration"]
    assert count == 1
    assert total >= 0.1
    transitions = m["yieldgate.breaker.transitions"]
    assert transitions == [({"yieldgate.gate": "svc", "from": "closed", "to": "open"}, 1)]
    assert {a["outcome"] for a, _ in m["yieldgate.call.duration"]} == {
        "ok",
        "RetriesExhaustedError",
    }
    assert "yieldgate.window.limit" in m


async def test_the_default_instrumentation_costs_nothing_without_an_sdk() -> None:
    g = Gate()  # global no-op providers

    async def one() -> int:
        return 1

    assert await g.call(one) == 1


def test_gates_built_without_a_name_each_get_their_own() -> None:
    names = {Gate().name for _ in range(3)}
    assert len(names) == 3
    assert all(name.startswith("gate-") for name in names)

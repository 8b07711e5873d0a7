"""Bursts against real servers: the figures agree with the server's own counters.

Each strategy's attempts, successes and yields, counted by the client, must
equal the change in the server's ``admitted``/``executed``/``yielded``
counters over its run; the JSON form must match the documented schema.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from tests.burst.conftest import schema_errors
from tests.conftest import RawClient
from yieldgate.burst import (
    SCHEMA,
    ArrivalProfile,
    BurstConfig,
    BurstReport,
    Slo,
    Strategy,
    StrategyResult,
    Workload,
    run_burst,
)
from yieldgate.server import ServerProcess

pytestmark = pytest.mark.e2e

ALL = tuple(Strategy(name=n) for n in ("yieldgate", "naive", "tenacity", "openai-default"))
SIM = ("--max-inflight", "4", "--exec-ms", "20")


def assert_consistent(result: StrategyResult, *, max_inflight: int) -> None:
    """Client-side figures against the server's counters and the timeline."""
    server = result.server
    assert server is not None
    assert server.max_inflight == max_inflight
    delta = server.delta
    assert delta["failed"] == delta["cancelled"] == delta["errors"] == 0
    assert result.attempts == delta["admitted"] + delta["yielded"]
    assert result.succeeded == delta["executed"] == delta["admitted"]
    assert result.yields == delta["yielded"]
    assert sum(server.yielded_by_reason.values()) == delta["yielded"]
    assert sum(result.errors_by_kind.values()) == result.failed
    assert result.succeeded + result.failed == result.requests
    last = result.timeline[-1]
    assert (last.completed, last.failed) == (result.succeeded, result.failed)
    assert last.client_attempts == result.attempts
    assert last.server_executed == delta["executed"]
    assert last.server_yielded == delta["yielded"]
    assert last.server_inflight == 0
    assert all((p.server_inflight or 0) <= max_inflight for p in result.timeline)
    assert server.inflight_peak <= max_inflight
    assert result.latency_s.count == result.succeeded


def assert_valid_json(report: BurstReport) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(json.dumps(report.as_dict()))
    assert schema_errors(document, SCHEMA) == []
    return document


def test_four_strategies_each_against_a_fresh_server() -> None:
    report = run_burst(
        BurstConfig(
            target="tcp://",
            serve_args=SIM,
            requests=40,
            strategies=ALL,
            sample_interval_s=0.02,
            scenario="test",
        )
    )
    assert [r.strategy for r in report.results] == [s.name for s in ALL]
    for result in report.results:
        assert_consistent(result, max_inflight=4)
        # Each strategy met a fresh server: the bound comes from its own counters.
        assert result.lower_bound_s == pytest.approx(40 * 0.02 / 4, rel=0.5)
    by = {r.strategy: r for r in report.results}
    assert by["yieldgate"].success_rate == 1.0
    assert by["naive"].attempts == 40  # one each, never more
    assert by["naive"].errors_by_kind == {"YieldExhaustedError": by["naive"].failed}
    assert by["tenacity"].success_rate == 1.0
    document = assert_valid_json(report)
    assert document["config"]["fresh_server_per_strategy"] is True
    assert document["results"][0]["timeline"]


@pytest.mark.anyio
async def test_a_shared_server_sees_the_sum_of_every_strategy(
    serve: Callable[..., ServerProcess],
) -> None:
    server = serve(*SIM)
    config = BurstConfig(
        target=server.url,
        requests=30,
        profile=ArrivalProfile.poisson(400),
        strategies=(Strategy(name="yieldgate"), Strategy(name="naive")),
        sample_interval_s=0.02,
    )
    report = await anyio.to_thread.run_sync(run_burst, config)
    for result in report.results:
        assert_consistent(result, max_inflight=4)
    client = await RawClient.connect(server)
    try:
        totals = await client.stats()
    finally:
        await client.aclose()
    assert totals["executed_total"] == sum(r.succeeded for r in report.results)
    assert totals["yielded_total"] == sum(r.yields for r in report.results)
    assert assert_valid_json(report)["config"]["fresh_server_per_strategy"] is False


@pytest.mark.parametrize("scheme", ["openai+http://", "hf+http://", "tgi+http://", "raw+http://"])
def test_http_targets_streaming(scheme: str) -> None:
    report = run_burst(
        BurstConfig(
            target=scheme,
            serve_args=SIM,
            requests=24,
            strategies=(Strategy(name="yieldgate"), Strategy(name="openai-default")),
            workload=Workload(stream=True, max_tokens=8),
            slo=Slo(ttft_ms=60_000, tpot_ms=60_000),
            sample_interval_s=0.02,
        )
    )
    for result in report.results:
        assert_consistent(result, max_inflight=4)
        assert result.streaming is not None
        if result.succeeded:
            assert result.streaming["ttft_ms"].count == result.succeeded
            assert result.streaming["itl_ms"].count > 0
        assert result.goodput_good == result.succeeded  # objectives nobody can miss
    assert report.results[0].success_rate == 1.0
    assert_valid_json(report)


def test_cold_start_is_ridden_out_and_counted() -> None:
    report = run_burst(
        BurstConfig(
            target="hf+http://",
            # Long enough that the naive strategy's 30 requests all meet the loading
            # model however loaded the machine is (half a second was not, once).
            serve_args=("--cold-start-s", "2.0", "--ramp-s", "0.5", *SIM),
            requests=30,
            strategies=(Strategy(name="yieldgate"), Strategy(name="naive")),
            sample_interval_s=0.02,
        )
    )
    yieldgate_run, naive = report.results
    for result in report.results:
        assert_consistent(result, max_inflight=4)
    assert yieldgate_run.success_rate == 1.0
    assert yieldgate_run.server is not None
    assert yieldgate_run.server.yielded_by_reason.get("cold_start", 0) > 0
    # The bound knows about the cold start the tool asked for.
    assert yieldgate_run.lower_bound_s is not None
    assert yieldgate_run.lower_bound_s > 2.0
    assert naive.success_rate == 0.0  # every request met the loading model


def test_a_programming_error_is_logged_not_only_counted(
    serve: Callable[..., ServerProcess],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = serve(*SIM)

    async def broken(self: Any, *args: Any, **kwargs: Any) -> Any:
        raise AttributeError("'Gate' object has no attribute '_breaker'")

    monkeypatch.setattr("yieldgate.GovernedClient.submit", broken)
    config = BurstConfig(
        target=server.url,
        requests=10,
        strategies=(Strategy(name="naive"),),
    )
    with caplog.at_level("ERROR", logger="yieldgate.burst"):
        report = run_burst(config)
    (result,) = report.results
    assert result.succeeded == 0
    # Counted as failures as before, and the traceback shown once, not ten times.
    logged = [r for r in caplog.records if r.name == "yieldgate.burst"]
    assert len(logged) == 1
    assert logged[0].exc_info is not None
    assert "_breaker" in str(logged[0].exc_info[1])


def test_the_quota_preset_costs_one_and_a_half_times_the_limit_as_the_server_counts() -> None:
    from yieldgate.burst import PRESETS
    from yieldgate.burst._presets import quota_cost
    from yieldgate.server import ProviderQuota, QuotaConfig
    from yieldgate.server._http_dialects import ChatCompletions

    preset = PRESETS["quota"]
    args = list(preset["serve_args"])
    tpm = int(args[args.index("--quota-tpm") + 1])
    workload: Workload = preset["workload"]
    total = quota_cost(workload, preset["requests"])
    assert abs(total - 1.5 * tpm) <= 1
    server = ProviderQuota(QuotaConfig(tpm=tpm))
    dialect = ChatCompletions()
    counted = 0
    for prompt in workload.prompts(preset["requests"], seed=0):
        body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": 64}
        job = dialect.parse(body, None, "m")
        counted += server.cost(job.prompt, job.params["max_tokens"])
    assert counted == total
    assert max(len(p) for p in workload.prompts(preset["requests"], seed=0)) / 4 < tpm


def test_the_quota_preset_is_rehearsed() -> None:
    from yieldgate.burst import PRESETS

    settings = {**PRESETS["quota"], "strategies": ALL[:2], "sample_interval_s": 0.05}
    report = run_burst(BurstConfig(**settings))
    yieldgate_run, naive = report.results
    assert yieldgate_run.success_rate == 1.0
    assert naive.succeeded + naive.failed == naive.requests == 120
    assert set(naive.errors_by_kind) <= {"YieldExhaustedError"}
    assert_valid_json(report)


def test_concurrency_caps_what_the_generator_keeps_outstanding() -> None:
    report = run_burst(
        BurstConfig(
            target="tcp://",
            serve_args=("--max-inflight", "8", "--exec-ms", "20"),
            requests=16,
            concurrency=2,
            strategies=(Strategy(name="naive"),),
            sample_interval_s=0.02,
        )
    )
    (result,) = report.results
    assert_consistent(result, max_inflight=8)
    # Never more than two sent at once, so a naive client meets no refusal.
    assert result.server is not None
    assert result.server.inflight_peak <= 2
    assert result.success_rate == 1.0
    assert all(p.client_inflight <= 2 for p in result.timeline)
    assert assert_valid_json(report)["config"]["concurrency"] == 2


def test_a_trace_sends_its_own_sizes(tmp_path: Any) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        "\n".join(
            json.dumps(line)
            for line in (
                {"offset_s": 0.0, "prompt_chars": 60, "max_tokens": 3},
                {"offset_s": 0.01, "prompt": "hello there", "max_tokens": 1},
                {"offset_s": 0.02},
            )
        )
    )
    report = run_burst(
        BurstConfig(
            target="openai+http://",
            serve_args=SIM,
            requests=3,
            profile=ArrivalProfile.trace(trace),
            strategies=(Strategy(name="yieldgate"),),
            workload=Workload(stream=True, max_tokens=2),
        )
    )
    (result,) = report.results
    assert result.success_rate == 1.0
    # The simulated backend echoes the prompt cut to max_tokens bytes, in at most 4
    # chunks: each entry's max_tokens, the workload's (2) for the entry without one.
    assert result.output_tokens == 3 + 1 + 2
    document = assert_valid_json(report)
    assert document["config"]["profile"]["kind"] == "trace"
    assert document["config"]["profile"]["trace_requests"] == 3


def test_a_sweep_runs_every_point_against_fresh_servers() -> None:
    from yieldgate.burst import SWEEP_SCHEMA, Sweep, run_sweep

    config = BurstConfig(
        target="tcp://",
        serve_args=SIM,
        requests=12,
        strategies=(Strategy(name="yieldgate"), Strategy(name="naive")),
        sample_interval_s=0.02,
    )
    report = run_sweep(config, Sweep.parse("concurrency=1,4"))
    assert [v for v, _ in report.points] == [1.0, 4.0]
    for value, point in report.points:
        assert point.config["concurrency"] == int(value)
        for result in point.results:
            assert_consistent(result, max_inflight=4)
            assert result.server is not None
            assert result.server.inflight_peak <= value
    document = json.loads(json.dumps(report.as_dict()))
    assert schema_errors(document, SWEEP_SCHEMA) == []
    assert document["sweep"] == {
        "axis": "concurrency",
        "values": [1.0, 4.0],
        "spec": report.sweep.describe(),
    }

"""``yieldgate burst`` as a user runs it: flags, files, errors."""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.burst.conftest import schema_errors
from tests.burst.test_html import network_references, plot_images
from yieldgate.burst import CSV_COLUMNS, SCHEMA, SWEEP_SCHEMA


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "yieldgate", "burst", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.e2e
def test_compare_writes_the_table_the_json_and_the_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "out.json", tmp_path / "plot.png"
    result = run_cli(
        "--serve",
        "--max-inflight 4 --exec-ms 20",
        "--requests",
        "30",
        "--profile",
        "gamma:300:0.5",
        "--compare",
        "--strategy",
        "yieldgate,naive",
        "--slo-e2e-ms",
        "60000",
        "--no-progress",
        "--json",
        str(out),
        "--plot",
        str(png),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "yieldgate" in result.stdout
    assert "naive" in result.stdout
    assert "attempts / request" in result.stdout
    assert "goodput: E2E <= 60000 ms" in result.stdout
    document = json.loads(out.read_text())
    assert schema_errors(document, SCHEMA) == []
    assert document["config"]["profile"]["spec"] == "gamma:300:0.5"
    assert document["config"]["serve_args"] == ["--max-inflight", "4", "--exec-ms", "20"]
    assert [r["strategy"] for r in document["results"]] == ["yieldgate", "naive"]
    for r in document["results"]:
        delta = r["server"]["delta"]
        assert r["attempts"] == delta["admitted"] + delta["yielded"]
        assert r["succeeded"] == delta["executed"]
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.e2e
def test_a_rate_sweep_writes_json_csv_and_plot(tmp_path: Path) -> None:
    out, table, png = tmp_path / "sweep.json", tmp_path / "sweep.csv", tmp_path / "sweep.png"
    result = run_cli(
        "--target",
        "openai+http://",
        "--serve",
        "--max-inflight 4 --exec-ms 10",
        "--sweep",
        "rate=100:200:x2",
        "--burstiness",
        "0.5",
        "--requests",
        "12",
        "--compare",
        "--strategy",
        "yieldgate,naive",
        "--stream",
        "--max-tokens",
        "4",
        "--slo",
        "ttft_ms=60000,e2e_ms=60000",
        "--no-progress",
        "--json",
        str(out),
        "--csv",
        str(table),
        "--plot",
        str(png),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "gamma:100:0.5" in result.stdout
    assert "gamma:200:0.5" in result.stdout
    document = json.loads(out.read_text())
    assert schema_errors(document, SWEEP_SCHEMA) == []
    assert document["sweep"]["values"] == [100, 200]
    assert [p["config"]["profile"]["spec"] for p in document["points"]] == [
        "gamma:100:0.5",
        "gamma:200:0.5",
    ]
    for point in document["points"]:
        assert [r["strategy"] for r in point["results"]] == ["yieldgate", "naive"]
        assert point["config"]["slo"] == {"ttft_ms": 60000, "tpot_ms": None, "e2e_ms": 60000}
        for r in point["results"]:
            assert r["goodput"]["good"] == r["succeeded"]  # objectives nobody can miss
            assert r["streaming"]["ttft_ms"]["count"] == r["succeeded"]
    with table.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert [(r["axis"], r["value"], r["strategy"]) for r in rows] == [
        ("rate", "100", "yieldgate"),
        ("rate", "100", "naive"),
        ("rate", "200", "yieldgate"),
        ("rate", "200", "naive"),
    ]
    assert all(r["ttft_ms_p50"] and r["tokens_per_s"] for r in rows if r["succeeded"] != "0")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_print_schema() -> None:
    result = run_cli("--print-schema")
    assert result.returncode == 0
    assert json.loads(result.stdout) == SCHEMA
    result = run_cli("--print-schema", "sweep")
    assert result.returncode == 0
    assert json.loads(result.stdout) == SWEEP_SCHEMA


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "tcp://"], "has no port: give HOST:PORT, or --serve"),
        (["--target", "ftp://x:1"], "scheme must be one of"),
        (["--serve", "", "--profile", "poisson"], "takes 1 number"),
        (["--serve", "", "--strategy", "hope"], "unknown strategy 'hope'"),
        (["--serve", "", "--strategy", "naive,tenacity"], "several strategies need --compare"),
        (["--serve", "", "--policy", "/nonexistent.json"], "neither a preset"),
        (["--serve", "", "--prompt-tokens", "a:b"], "--prompt-tokens: bad entry"),
        (["--serve", "--max-inflight 0", "--requests", "1"], "did not start"),
        (["--serve", "", "--sweep", "speed=1,2"], "--sweep: sweep 'speed=1,2': unknown axis"),
        (["--serve", "", "--sweep", "rate=1:8:2"], "the step must be +N"),
        (["--serve", "", "--sweep", "rate=1,2", "--profile", "ramp:1:2:3"], "rate sweep needs"),
        (["--serve", "", "--burstiness", "0.5"], "--burstiness needs Poisson arrivals"),
        (["--serve", "", "--slo", "ttft=5"], "--slo: bad entry 'ttft=5'"),
        (["--serve", "", "--slo", "e2e_ms=-1"], "--slo e2e_ms must be"),
        (["--serve", "", "--concurrency", "0"], "--concurrency must be >= 1"),
        (["--serve", "", "--workers", "0"], "--workers must be >= 1"),
        (["--serve", "", "--workers", "3", "--concurrency", "2"], "--concurrency must be >= w"),
        (["--serve", "", "--profile", "trace:/nonexistent.jsonl"], "cannot read it"),
        (["--serve", "", "--timeout-s", "0"], "--timeout-s must be a finite number > 0"),
        (["--serve", "", "--priority-mix", "urgent=1"], "unknown priority 'urgent'"),
        (
            ["--serve", "", "--target", "hf+http://", "--priority-mix", "high=1"],
            "cannot send priorities",
        ),
        (["--serve", "", "--scrape", "localhost:9/metrics"], "give an http:// URL"),
        (
            ["--preset", "buffering-vs-governed", "--sweep", "rate=1,2"],
            "runs several presets: it takes no --sweep",
        ),
    ],
)
def test_bad_input_is_one_line_and_status_2(args: list[str], message: str) -> None:
    result = run_cli(*args, "--no-progress")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def burst_parser() -> argparse.ArgumentParser:
    """``yieldgate burst``'s own argument parser, as the CLI builds it."""
    from yieldgate.cli import _burst

    made: dict[str, argparse.ArgumentParser] = {}

    class Sub:
        def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
            kwargs.pop("help", None)
            made[name] = argparse.ArgumentParser(name, **kwargs)
            return made[name]

    _burst.add_parser(Sub())
    return made["burst"]


def test_the_preset_choices_are_the_presets() -> None:
    from yieldgate.burst._presets import COMPARISONS, PRESETS

    parser = burst_parser()
    (preset,) = [a for a in parser._actions if a.dest == "preset"]
    assert preset.choices is not None
    assert sorted(preset.choices) == sorted([*PRESETS, *COMPARISONS])


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the harness extra")
def test_a_sweep_against_the_harness_writes_json_csv_and_html(tmp_path: Path) -> None:
    out, table, page = tmp_path / "s.json", tmp_path / "s.csv", tmp_path / "r" / "s.html"
    page.parent.mkdir()  # the tool makes no directories
    result = run_cli(
        *("--serve", "--backend harness --max-inflight 2", "--wait-ready"),
        *("--sweep", "rate=100,200", "--requests", "6"),
        *("--compare", "--strategy", "yieldgate,naive", "--stream", "--max-tokens", "4"),
        *("--no-progress", "--json", str(out), "--csv", str(table), "--html", str(page)),
        timeout=110,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"HTML report written to {page}" in result.stdout
    document = json.loads(out.read_text())
    assert schema_errors(document, SWEEP_SCHEMA) == []
    assert document["config"]["serve_args"] == ["--backend", "harness", "--max-inflight", "2"]
    for point in document["points"]:
        for r in point["results"]:
            assert r["server"]["serving"] is not None  # the harness's own metrics
    with table.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        assert len(list(reader)) == 4
    text = page.read_text(encoding="utf-8")
    assert plot_images(text) == {
        "plot-latency": 1,
        "plot-goodput": 1,
        "plot-pareto": 1,
        "plot-timeline-1": 1,
        "plot-timeline-2": 1,
    }
    assert network_references(text) == []
    assert "--backend harness --max-inflight 2" in text


def test_the_comparison_preset_builds_one_config_per_part(monkeypatch: pytest.MonkeyPatch) -> None:
    from yieldgate.cli import _burst

    parser = burst_parser()
    seen: dict[str, Any] = {}

    def fake_execute(config: Any, **kwargs: Any) -> Any:
        seen["config"], seen["kwargs"] = config, kwargs
        return argparse.Namespace(results=())  # a report with no result: nothing unreached

    monkeypatch.setattr(_burst, "execute", fake_execute)
    args = parser.parse_args(
        ["--preset", "buffering-vs-governed", "--requests", "50", "--timeout-s", "2"]
    )
    assert _burst.run(args) == 0
    assert seen["kwargs"]["comparison"] == "buffering-vs-governed"
    (label_a, a), (label_b, b) = seen["config"]
    assert (label_a, label_b) == ("buffering", "governed")
    assert a.serve_args == (*b.serve_args, "--queue", "unbounded")
    assert a.requests == b.requests == 50  # flags apply to every part
    assert a.timeout_s == b.timeout_s == 2.0
    assert a.scenario == "buffering"
    assert b.scenario == "buffering-governed"

"""``yieldgate burst`` as a user runs it: flags, files, errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.burst.conftest import schema_errors
from yieldgate.burst import SCHEMA


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


def test_print_schema() -> None:
    result = run_cli("--print-schema")
    assert result.returncode == 0
    assert json.loads(result.stdout) == SCHEMA


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
    ],
)
def test_bad_input_is_one_line_and_status_2(args: list[str], message: str) -> None:
    result = run_cli(*args, "--no-progress")
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr

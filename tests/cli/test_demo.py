"""``yieldgate demo``: the burst comparison ``make demo`` runs, and the seed scenario."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.burst.conftest import schema_errors
from yieldgate.burst import SCHEMA


@pytest.mark.e2e
def test_demo_reproduces_the_seed_scenario() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yieldgate", "demo", "--seed-scenario", "--exec-ms", "1500"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "executed: 1   yielded: 19   peak inflight seen: 1" in out
    assert "final counters: executed_total=1 yielded_total=19 inflight=0" in out
    assert "seed scenario reproduced" in out


def test_demo_refuses_a_single_client() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yieldgate", "demo", "--seed-scenario", "--clients", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "--clients must be at least 2" in result.stderr


@pytest.mark.e2e
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the harness extra")
def test_demo_compares_three_strategies_on_the_disaggregated_harness(tmp_path: Path) -> None:
    png, out = tmp_path / "demo.png", tmp_path / "demo.json"
    result = subprocess.run(
        [
            *(sys.executable, "-m", "yieldgate", "demo", "--requests", "12"),
            *("--max-inflight", "4", "--no-progress", "--plot", str(png), "--json", str(out)),
        ],
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "--backend harness --prefill-workers 1 --max-inflight 4" in result.stdout
    assert "yieldgate: success 100.0%" in result.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"
    document = json.loads(out.read_text())
    assert schema_errors(document, SCHEMA) == []
    assert [r["strategy"] for r in document["results"]] == ["yieldgate", "naive", "tenacity"]
    for r in document["results"]:
        assert r["streaming"]["ttft_ms"]["count"] == r["succeeded"]
        serving = r["server"]["serving"]  # the harness's own serving metrics came along
        assert serving["requests"] >= r["succeeded"]
        delta = r["server"]["delta"]
        assert r["attempts"] == delta["admitted"] + delta["yielded"]

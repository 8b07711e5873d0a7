"""``yieldgate demo``: the seed scenario replayed and checked, as ``make demo`` runs it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.e2e
def test_demo_reproduces_the_seed_scenario() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "yieldgate", "demo", "--exec-ms", "1500"],
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
        [sys.executable, "-m", "yieldgate", "demo", "--clients", "1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 2
    assert "--clients must be at least 2" in result.stderr

"""The CSV: its documented columns, one row per strategy (per point of a sweep)."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from tests.burst.test_report import _report
from yieldgate.burst import CSV_COLUMNS, Sweep, SweepReport, write_csv
from yieldgate.burst._csv import csv_rows

DOCS = Path(__file__).resolve().parents[2] / "docs" / "burst.md"


def test_a_burst_is_one_row_per_strategy(tmp_path: Path) -> None:
    out = write_csv(_report(with_server=True), tmp_path / "sub" / "r.csv")
    with out.open(newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == CSV_COLUMNS
        rows = list(reader)
    assert [r["strategy"] for r in rows] == ["yieldgate", "naive"]
    yg, naive = rows
    assert (yg["axis"], yg["value"], yg["profile"]) == ("", "", "all-at-once")
    assert float(yg["success_rate"]) == 1.0
    assert float(naive["success_rate"]) == pytest.approx(1 / 3)
    assert naive["errors_by_kind"] == "YieldExhaustedError=2"
    assert yg["server_yielded_by_reason"] == "saturated=2"
    assert float(yg["e2e_ms_p50"]) == pytest.approx(200.0)
    assert float(yg["ttft_ms_p99"]) == pytest.approx(150.0)
    assert int(yg["output_tokens"]) == 6
    assert float(yg["goodput_ratio"]) == pytest.approx(2 / 3)  # one TPOT of 150 ms > 100


def test_a_sweep_is_one_row_per_strategy_per_point() -> None:
    burst = _report(with_server=False)
    sweep = SweepReport(
        sweep=Sweep.parse("rate=1,2"),
        config=burst.config,
        machine={},
        created=burst.created,
        points=((1.0, burst), (2.0, burst)),
    )
    rows = csv_rows(sweep)
    assert [(r["axis"], r["value"], r["strategy"]) for r in rows] == [
        ("rate", "1", "yieldgate"),
        ("rate", "1", "naive"),
        ("rate", "2", "yieldgate"),
        ("rate", "2", "naive"),
    ]
    assert all(set(r) == set(CSV_COLUMNS) for r in rows)
    assert rows[0]["server_yielded_by_reason"] == ""


def test_every_column_is_documented() -> None:
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", DOCS.read_text(), re.MULTILINE))
    assert set(CSV_COLUMNS) - documented == set()

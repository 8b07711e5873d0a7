"""``yieldgate.burst.locust`` on a real Locust cluster, and the Gate under gevent.

Locust monkey-patches its process with gevent, so everything here runs in
child processes: a headless master, two workers and a ``yieldgate serve``,
all on 127.0.0.1. Locust's request counts and yieldgate's must agree
exactly, and the server's within what was in flight when the workers stopped.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import free_port
from yieldgate.server import ServerProcess, spawn

# Only looked for: importing locust here would monkey-patch pytest's own process, after
# ssl and the sockets were imported (gevent then recurses in ssl's setters).
if importlib.util.find_spec("locust") is None:
    pytest.skip("locust is not installed (compat/requirements.txt)", allow_module_level=True)

PROBE = Path(__file__).with_name("gevent_probe.py")
USERS = 8
LOCUSTFILE = "from yieldgate.burst.locust import YieldgateFastHttpUser  # noqa: F401\n"


def test_the_sync_driver_works_under_gevent_monkey_patching() -> None:
    users, calls = 12, 20
    result = subprocess.run(
        [sys.executable, str(PROBE), str(users), str(calls)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    probe: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    assert probe["patched"] is True
    assert probe["event_class"].startswith("gevent.")  # the driver waits on gevent's Event
    assert probe["errors"] == []
    assert probe["finished"] == users
    assert probe["completed"] == probe["calls_ok"] == users * calls
    # The upstream had 4 slots for 12 greenlets: the Gate met yields, waited them out
    # and never let more than the upstream's slots run at once.
    assert probe["peak"] <= 4
    assert probe["yields"] == probe["busy"] == probe["retries"] > 0
    assert probe["attempts"] == users * calls + probe["yields"]
    assert probe["inflight_after"] == 0


@pytest.fixture
def governed() -> Iterator[ServerProcess]:
    with spawn("--max-inflight", "4", "--exec-ms", "10", http=True) as server:
        yield server


def _locust(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "locust", "-f", "locustfile.py", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _stop(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_a_master_and_two_workers_report_every_strategy(
    governed: ServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "locustfile.py").write_text(LOCUSTFILE)
    port = free_port()
    host = governed.http_url
    out = tmp_path / "yieldgate.json"
    master = _locust(
        "--master",
        "--headless",
        "--master-bind-host=127.0.0.1",
        f"--master-bind-port={port}",
        "--expect-workers=2",
        "--expect-workers-max-wait=60",
        f"--users={USERS}",
        f"--spawn-rate={USERS}",
        "--run-time=2s",
        f"--host={host}",
        "--yieldgate-strategy=yieldgate,naive",
        f"--yieldgate-json={out}",
        f"--csv={tmp_path / 'run'}",
        "--exit-code-on-error=0",
        cwd=tmp_path,
    )
    workers = [
        _locust("--worker", "--master-host=127.0.0.1", f"--master-port={port}", cwd=tmp_path)
        for _ in range(2)
    ]
    try:
        output, _ = master.communicate(timeout=120)
        assert master.returncode == 0, output
        for worker in workers:
            worker.wait(timeout=30)
    finally:
        _stop([master, *workers])

    with (tmp_path / "run_stats.csv").open(newline="") as f:
        rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    ours = json.loads(out.read_text())["strategies"]
    assert set(ours) == {"yieldgate", "naive"}
    for strategy, counts in ours.items():
        row = rows[(strategy, "chat")]  # one Locust entry per strategy, per request
        assert int(row["Request Count"]) == counts["requests"] > 0
        assert int(row["Failure Count"]) == counts["failed"]
        assert counts["succeeded"] + counts["failed"] == counts["requests"]
        assert counts["attempts"] >= counts["requests"]
    # One attempt per request, and one per request cut off when the run stopped.
    assert 0 <= ours["naive"]["attempts"] - ours["naive"]["requests"] <= USERS
    assert ours["yieldgate"]["failed"] == 0  # it waits yields out; naive gives up
    assert f"yieldgate yieldgate: {ours['yieldgate']['requests']} requests" in output

    # Every attempt reached the server once: the counts agree but for the attempts
    # still on the wire when the workers stopped (at most one per user).
    stats = httpx.get(f"{host}/stats", timeout=10).json()
    attempts = sum(c["attempts"] for c in ours.values())
    # (An attempt is counted as it starts: one cut off may not have reached the server.)
    assert abs(stats["executed_total"] + stats["yielded_total"] - attempts) <= USERS
    assert 0 <= stats["executed_total"] - sum(c["succeeded"] for c in ours.values()) <= USERS
    assert 0 <= stats["yielded_total"] - sum(c["yields"] for c in ours.values()) <= USERS

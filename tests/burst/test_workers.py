"""``--workers N``: the split, the merge, and real runs from several processes.

The merge must give the figures one process would have given for the same
records (percentiles from the merged samples, counters summed, timelines on
the common clock), count every request once, and the real runs must agree
with the server's own counters and the schema.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.burst.conftest import schema_errors
from tests.burst.test_runner import assert_consistent
from tests.cli.test_burst import run_cli
from yieldgate.burst import (
    SCHEMA,
    SWEEP_SCHEMA,
    ArrivalProfile,
    BurstConfig,
    Slo,
    Strategy,
    StrategyResult,
    Sweep,
    TimelinePoint,
    run_burst,
    run_sweep,
)
from yieldgate.burst._merge import (
    Part,
    merge_requests,
    merge_timelines,
    split_concurrency,
    split_requests,
)
from yieldgate.burst._results import summarise
from yieldgate.burst._targets import Request
from yieldgate.server import ServerProcess

SIM = ("--max-inflight", "4", "--exec-ms", "20")


def _request(i: int, *, ok: bool = True, end: float | None = None) -> Request:
    arrival = i * 0.01
    request = Request(
        index=i, arrival_s=arrival, end_s=arrival + 0.05 + i * 0.001 if end is None else end
    )
    request.ok = ok
    request.error = None if ok else "HTTP 429"
    request.chunk_s = [arrival + 0.01, arrival + 0.02, arrival + 0.04] if ok else []
    return request


def _point(t: float, n: int) -> TimelinePoint:
    return TimelinePoint(
        t_s=t, client_inflight=n, client_attempts=10 * n, client_yields=n, completed=n, failed=0
    )


# -- the split ------------------------------------------------------------------------


@pytest.mark.parametrize(("requests", "workers"), [(10, 1), (10, 3), (7, 2), (2, 4)])
def test_requests_are_dealt_round_robin_each_once(requests: int, workers: int) -> None:
    shares = split_requests(requests, workers)
    assert len(shares) == workers
    assert sorted(i for share in shares for i in share) == list(range(requests))
    for w, share in enumerate(shares):
        assert share == list(range(w, requests, workers))
    assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_each_share_keeps_its_arrival_times() -> None:
    offsets = ArrivalProfile.poisson(50).offsets(40, seed=3)
    shares = split_requests(40, 3)
    # Together the shares are the requested arrival process, instant by instant.
    merged = sorted(offsets[i] for share in shares for i in share)
    assert merged == sorted(offsets)


def test_a_concurrency_cap_is_shared_out() -> None:
    assert split_concurrency(None, 3) == [None, None, None]
    assert split_concurrency(7, 3) == [3, 2, 2]
    assert split_concurrency(4, 4) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="concurrency must be >= workers"):
        split_concurrency(1, 2)


def test_config_checks_workers() -> None:
    with pytest.raises(ValueError, match="workers must be >= 1"):
        BurstConfig(target="tcp://", serve_args=(), workers=0)
    with pytest.raises(ValueError, match="concurrency must be >= workers"):
        BurstConfig(target="tcp://", serve_args=(), workers=3, concurrency=2)
    assert BurstConfig(target="tcp://", serve_args=(), workers=2).as_dict()["workers"] == 2


# -- the merge ------------------------------------------------------------------------


def test_merged_records_summarise_as_one_process_would() -> None:
    whole = [_request(i, ok=i % 5 != 0) for i in range(30)]
    shares = split_requests(30, 3)
    parts = [
        Part(worker=w, requests=[whole[i] for i in share], attempts=len(share) + w, yields=w)
        for w, share in enumerate(shares)
    ]
    merged = merge_requests(parts, 30)
    assert [r.index for r in merged] == list(range(30))

    def summary(requests: list[Request], attempts: int, yields: int) -> StrategyResult:
        return summarise(
            strategy="naive",
            label="naive",
            requests=requests,
            attempts=attempts,
            yields=yields,
            slo=Slo(e2e_ms=60),
            stream=True,
            server=None,
            timeline=(),
        )

    one = summary(whole, 33, 3)
    many = summary(merged, sum(p.attempts for p in parts), sum(p.yields for p in parts))
    assert many.as_dict() == one.as_dict()
    assert (many.requests, many.succeeded, many.attempts) == (30, 24, 33)
    assert many.latency_s.count == 24
    assert many.streaming is not None
    assert many.streaming["ttft_ms"].count == 24


def test_every_request_comes_back_exactly_once() -> None:
    a = Part(worker=0, requests=[_request(0), _request(2)])
    b = Part(worker=1, requests=[_request(1)])
    assert [r.index for r in merge_requests([b, a], 3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="request 2 came back twice"):
        merge_requests([a, Part(worker=1, requests=[_request(1), _request(2)])], 3)
    with pytest.raises(RuntimeError, match="1 requests never came back"):
        merge_requests([a], 3)
    with pytest.raises(RuntimeError, match="not in the run"):
        merge_requests([a, b, Part(worker=2, requests=[_request(7)])], 3)


def test_timelines_add_up_on_the_common_clock() -> None:
    first = [_point(0.0, 1), _point(0.1, 2), _point(0.2, 3)]
    second = [_point(0.05, 10), _point(0.15, 20)]
    before = {"executed_total": 100, "yielded_total": 50, "inflight": 0}
    server = [
        (0.02, {"executed_total": 101, "yielded_total": 50, "inflight": 2}),
        (0.12, {"executed_total": 130, "yielded_total": 55, "inflight": 4}),
    ]
    merged = merge_timelines([first, second], server, before)
    assert [p.t_s for p in merged] == [0.0, 0.05, 0.1, 0.15, 0.2]
    # Each worker as of its last sample by then, summed.
    assert [p.completed for p in merged] == [1, 11, 12, 22, 23]
    assert [p.client_attempts for p in merged] == [10, 110, 120, 220, 230]
    assert [p.server_executed for p in merged] == [None, 1, 1, 30, 30]
    assert [p.server_yielded for p in merged] == [None, 0, 0, 5, 5]
    assert [p.server_inflight for p in merged] == [None, 2, 2, 4, 4]


def test_instants_a_hair_apart_are_one_point_and_no_server_means_none() -> None:
    merged = merge_timelines([[_point(0.1, 1)], [_point(0.1005, 2)]])
    assert len(merged) == 1
    assert merged[0].completed == 3
    assert merged[0].server_executed is None


# -- real runs ------------------------------------------------------------------------


@pytest.mark.e2e
def test_two_workers_from_the_cli_count_every_request_once(tmp_path: Path) -> None:
    out = tmp_path / "burst.json"
    result = run_cli(
        "--serve",
        " ".join(SIM),
        "--requests",
        "60",
        "--workers",
        "2",
        "--compare",
        "--strategy",
        "yieldgate,naive",
        "--sample-ms",
        "20",
        "--no-progress",
        "--json",
        str(out),
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    document: dict[str, Any] = json.loads(out.read_text())
    assert schema_errors(document, SCHEMA) == []
    assert document["config"]["workers"] == 2
    for row in document["results"]:
        assert row["requests"] == 60
        assert row["succeeded"] + row["failed"] == 60
        delta = row["server"]["delta"]
        # Every attempt reached the one server exactly once, from one of the workers.
        assert row["attempts"] == delta["admitted"] + delta["yielded"]
        assert row["succeeded"] == delta["executed"]
        last = row["timeline"][-1]
        assert (last["completed"], last["failed"]) == (row["succeeded"], row["failed"])
        assert last["client_attempts"] == row["attempts"]
    by = {row["strategy"]: row for row in document["results"]}
    assert by["yieldgate"]["success_rate"] == 1.0
    assert by["naive"]["attempts"] == 60
    # The table's title (rich may wrap it) says how it was sent.
    assert "all-at-once, from 2 workers -> tcp://" in " ".join(result.stdout.split())


@pytest.mark.e2e
def test_a_sweep_from_two_workers_agrees_with_the_server() -> None:
    config = BurstConfig(
        target="tcp://",
        serve_args=SIM,
        requests=30,
        profile=ArrivalProfile.poisson(100),
        strategies=(Strategy(name="yieldgate"),),
        sample_interval_s=0.02,
        workers=2,
    )
    report = run_sweep(config, Sweep.parse("rate=200,400"))
    document = json.loads(json.dumps(report.as_dict()))
    assert schema_errors(document, SWEEP_SCHEMA) == []
    for _, point in report.points:
        assert point.config["workers"] == 2
        (result,) = point.results
        assert_consistent(result, max_inflight=4)
        assert result.success_rate == 1.0
    assert multiprocessing.active_children() == []


class _Breaks:
    """Progress that fails once requests are on their way."""

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self) -> None:
        raise KeyboardInterrupt

    def finish(self, result: StrategyResult) -> None:
        pass


@pytest.mark.e2e
def test_workers_are_stopped_when_the_parent_fails() -> None:
    config = BurstConfig(
        target="tcp://",
        serve_args=SIM,
        requests=40,
        strategies=(Strategy(name="naive"),),
        workers=2,
    )
    with pytest.raises(KeyboardInterrupt):
        run_burst(config, progress=_Breaks())
    assert multiprocessing.active_children() == []


def _spawned_children(pid: int) -> list[int]:
    """The live processes ``multiprocessing`` spawned for ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
        alive = not fields.get("State", "").startswith("Z")
        if alive and fields.get("PPid", "").strip() == str(pid) and b"spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def _wait_for(condition: Any, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_workers_end_themselves_when_the_parent_is_killed(
    serve: Callable[..., ServerProcess],
) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "50")
    parent = subprocess.Popen(
        [
            *(sys.executable, "-m", "yieldgate", "burst", "--target", server.url),
            *("--requests", "5000", "--workers", "2", "--strategy", "yieldgate", "--no-progress"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []
    try:
        _wait_for(lambda: len(_spawned_children(parent.pid)) == 2)
        workers = _spawned_children(parent.pid)
        parent.kill()  # no clean-up can run in the parent
        parent.wait()

        def gone() -> bool:
            for pid in workers:
                try:
                    state = Path(f"/proc/{pid}/status").read_text()
                except OSError:
                    continue
                if "State:\tZ" not in state:
                    return False
            return True

        _wait_for(gone)
    finally:
        parent.kill()
        parent.wait()
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


class _Conn:
    def __init__(self, *messages: tuple[Any, ...]) -> None:
        self.messages = list(messages)

    def poll(self) -> bool:
        return bool(self.messages)

    def recv(self) -> tuple[Any, ...]:
        return self.messages.pop(0)


class _Process:
    def __init__(self, alive: bool, exitcode: int | None = None) -> None:
        self.alive, self.exitcode = alive, exitcode
        self.pid = 0

    def is_alive(self) -> bool:
        return self.alive


def _pool(conns: list[_Conn], processes: list[_Process]) -> Any:
    from yieldgate.burst._stop import Stop
    from yieldgate.burst._workers import _Pool

    pool = object.__new__(_Pool)
    pool.workers, pool.conns, pool.processes = len(conns), conns, processes
    pool.stop = Stop()
    for n, process in enumerate(processes):
        process.pid = 1000 + n
    return pool


def test_the_pool_gathers_answers_and_fails_on_a_worker_error_or_death() -> None:
    answers: dict[int, Any] = {}
    pool = _pool([_Conn(("ready",)), _Conn()], [_Process(True), _Process(True)])
    assert pool.poll("ready", answers) is False
    assert answers == {0: None}
    pool.conns[1].messages.append(("ready",))
    assert pool.poll("ready", answers) is True

    error = "Traceback (most recent call last):\n  ...\nValueError: boom\n"
    failing = _pool([_Conn(("error", error))], [_Process(True)])
    with pytest.raises(RuntimeError, match=r"^burst worker 0 failed: ValueError: boom$"):
        failing.poll("done", {})
    # A dead worker cuts the run short (issue 41): the stop names it and its status.
    dead = _pool([_Conn(), _Conn()], [_Process(True), _Process(False, exitcode=-9)])
    from yieldgate.burst._workers import _CutShort

    with dead.stop.watching(*dead.watched()), pytest.raises(_CutShort):
        dead.poll("done", {})
    assert dead.stop.reason == "burst worker 1 (pid 1001) was killed by SIGKILL"

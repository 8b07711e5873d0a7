"""``yieldgate burst`` cut short (issue 41, item 5): Ctrl-C, a dead server, a missing package.

Each case runs the real command in a child process against servers it starts
itself (port 0). The run is signalled once it has measured something: the
server's own counters say requests were executed (a condition polled, never a
sleep). The tool runs in a process group of its own, so that a Ctrl-C is sent
the way a terminal sends it: to the whole group.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.burst.conftest import schema_errors
from tests.cli.test_errors import cli_without, one_line
from yieldgate.burst import SCHEMA

_STARTED = re.compile(r"started yieldgate serve \(pid (\d+)\) at raw\+http://([\d.]+:\d+)")
_WAIT_S = 60.0


class Burst:
    """A running ``yieldgate burst`` and what it has said on standard error so far."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "yieldgate", "burst", *args, "--log-level", "info"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.started = threading.Event()
        self.server_pid = 0
        self.server = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            found = _STARTED.search(line)
            if found and not self.started.is_set():
                self.server_pid, self.server = int(found[1]), found[2]
                self.started.set()

    def wait_measured(self, executed: int = 3) -> None:
        """Until the started server has executed ``executed`` requests of the burst."""
        assert self.started.wait(_WAIT_S), "".join(self.lines)
        deadline = time.monotonic() + _WAIT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                stats = httpx.get(f"http://{self.server}/stats", timeout=5).json()
                if stats["executed_total"] >= executed:
                    return
            time.sleep(0.02)
        raise AssertionError("the burst executed nothing")

    def finish(self) -> tuple[int, str, str]:
        """The exit status, standard output and standard error (``--log-level info``'s
        lines of httpx left out)."""
        assert self.process.stdout is not None
        stdout = self.process.stdout.read()  # standard error is the reader thread's
        self.process.wait(_WAIT_S)
        self._reader.join(_WAIT_S)
        err = "".join(line for line in self.lines if " httpx: " not in line)
        return self.process.returncode, stdout, err

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        if self.server_pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.server_pid, signal.SIGKILL)
        self.process.wait()


@contextlib.contextmanager
def burst(*args: str) -> Iterator[Burst]:
    running = Burst(*args)
    try:
        yield running
    finally:
        running.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie no one has reaped yet has exited too.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    return True


def _long_burst(tmp_path: Path, *extra: str) -> list[str]:
    # 400 requests, two at a time, 50 ms each: ten seconds a strategy, cut short long before.
    return [
        "--serve",
        "--max-inflight 2 --exec-ms 50",
        "--target",
        "raw+http://",
        "-n",
        "400",
        "--concurrency",
        "2",
        "--no-progress",
        "--json",
        str(tmp_path / "out.json"),
        *extra,
    ]


@pytest.mark.e2e
def test_ctrl_c_writes_the_partial_report_marked_interrupted(tmp_path: Path) -> None:
    out, page, table = tmp_path / "out.json", tmp_path / "out.html", tmp_path / "out.csv"
    args = _long_burst(tmp_path, "--compare", "--strategy", "yieldgate,naive")
    with burst(*args, "--html", str(page), "--csv", str(table)) as run:
        run.wait_measured()
        # As a terminal's Ctrl-C: to the tool's whole process group.
        os.killpg(run.process.pid, signal.SIGINT)
        status, stdout, stderr = run.finish()
        server_alive = _alive(run.server_pid)
    assert status == 130, stderr
    assert stderr.splitlines()[-1] == (
        f"yieldgate burst: interrupted by SIGINT; partial report in {table}, {out}, {page}"
    )
    assert "Traceback" not in stderr
    # The server did not get the terminal's SIGINT: the tool stopped it, after the run.
    assert not server_alive
    document = json.loads(out.read_text())
    assert schema_errors(document, SCHEMA) == []
    assert document["interrupted"] is True
    assert document["stopped_by"] == "interrupted by SIGINT"
    assert document["unfinished"] == ["yieldgate", "naive"]
    (result,) = document["results"]
    assert result["complete"] is False
    assert result["succeeded"] >= 3
    assert result["errors_by_kind"]["interrupted"] == 400 - result["succeeded"]
    assert "(cut short)" in stdout
    assert 'id="interrupted"' in page.read_text()
    rows = list(csv.DictReader(table.open()))
    assert [row["complete"] for row in rows] == ["0"]


@pytest.mark.e2e
def test_a_dead_server_fails_the_run_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    with burst(*_long_burst(tmp_path)) as run:
        run.wait_measured()
        os.kill(run.server_pid, signal.SIGKILL)
        status, _, stderr = run.finish()
    assert status == 3, stderr
    lines = [line for line in stderr.splitlines() if "error" in line]
    assert lines == [
        f"yieldgate burst: error: the server the tool started (pid {run.server_pid}) was "
        f"killed by SIGKILL; partial report in {out}"
    ]
    document = json.loads(out.read_text())
    assert schema_errors(document, SCHEMA) == []
    assert document["interrupted"] is True
    assert document["stopped_by"].endswith("was killed by SIGKILL")
    (result,) = document["results"]
    assert result["complete"] is False
    assert result["succeeded"] >= 3


@pytest.mark.parametrize(
    ("module", "target", "line"),
    [
        (
            "openai",
            "openai+http://",
            "an openai+http:// target needs the openai package "
            "(no module named 'openai'): pip install openai",
        ),
        (
            "anthropic",
            "anthropic+http://",
            "an anthropic+http:// target needs the anthropic "
            "package (no module named 'anthropic'): pip install anthropic",
        ),
        (
            "huggingface_hub",
            "hf+http://",
            "an hf+http:// target needs the huggingface_hub "
            "package (no module named 'huggingface_hub'): pip install huggingface-hub",
        ),
        (
            "uvicorn",
            "raw+http://",
            "--serve with an HTTP target (the server's HTTP front) "
            "needs the 'server' extra (no module named 'uvicorn'): pip install 'yieldgate[server]'",
        ),
    ],
)
def test_a_missing_package_names_its_pip_line_before_anything_starts(
    module: str, target: str, line: str
) -> None:
    result = cli_without(
        module,
        "burst",
        "--target",
        target,
        "--serve",
        "",
        "-n",
        "1",
        "--no-progress",
        "--log-level",
        "info",
    )
    assert result.returncode == 1, result.stderr
    # One line, and no server was started first (it would have said so at info level).
    assert one_line(result) == f"yieldgate burst: error: {line}"

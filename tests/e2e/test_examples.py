"""Every script in examples/ runs as a user runs it, against a real local server.

Each example is a subprocess with short parameters; the tests check its exit
status and the behaviour it reports (successes, yields, the server's peak
inflight). An example runs in a session of its own, so servers it starts
itself die with it when a test times out or fails. ``test_every_example_is_run``
fails for an example that no test here runs.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from yieldgate.server import ServerProcess

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
Serve = Callable[..., ServerProcess]


def run_example(name: str, *args: str, timeout: float = 60.0) -> str:
    """Run ``examples/NAME ARGS``; return its standard output once it exits with 0."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / name), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{name} ran past {timeout} s:\n{out}{err}")
    finally:
        # Whatever the example started (servers) shares its process group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, f"{name} exited with {proc.returncode}:\n{out}{err}"
    return out


def number(pattern: str, text: str) -> float:
    """The number that ``pattern``'s one group matches in ``text``."""
    found = re.search(pattern, text)
    assert found is not None, f"{pattern!r} not in:\n{text}"
    return float(found.group(1))


def assert_peak_within(out: str, slots: int) -> None:
    peak = number(r"peak inflight (\d+) of", out)
    assert 1 <= peak <= slots, out


# -- the official clients ----------------------------------------------------------------

COLD = ("--cold-start-s", "1.0", "--ramp-s", "1.0")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_openai_chat(serve: Serve, stream: bool) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "20", "--http-port", "0")
    args = ["--base-url", f"{server.http_url}/v1", "--requests", "40"]
    out = run_example("openai_chat.py", *args, *(["--stream"] if stream else []))
    assert "40/40 succeeded" in out


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_anthropic_messages(serve: Serve, stream: bool) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "20", "--http-port", "0")
    args = ["--base-url", server.http_url or "", "--requests", "40"]
    out = run_example("anthropic_messages.py", *args, *(["--stream"] if stream else []))
    assert "40/40 succeeded" in out
    # 40 at once on 4 slots: the server's 529s were waited out, not failed.
    assert number(r"overloads (\d+)", out) + number(r"yields (\d+)", out) > 0


def test_sync_threads(serve: Serve) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "20", "--http-port", "0")
    out = run_example("sync_threads.py", "--url", server.http_url or "", "--threads", "40")
    assert "40/40 succeeded" in out
    assert_peak_within(out, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_huggingface_text_across_a_cold_start(serve: Serve, stream: bool) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "20", "--http-port", "0", *COLD)
    args = ["--url", f"{server.http_url}/models/tiny", "--requests", "40"]
    out = run_example("huggingface_text.py", *args, *(["--stream"] if stream else []))
    assert "40/40 succeeded" in out
    # The loading model's 503s were waited out as yields.
    assert number(r"yields (\d+)", out) > 0


# -- plain httpx and the governed protocol -----------------------------------------------


@pytest.mark.parametrize("dialect", ["tgi", "governed-http"])
def test_plain_httpx(serve: Serve, dialect: str) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "50", "--http-port", "0")
    assert server.http_url is not None
    out = run_example("plain_httpx.py", "--url", server.http_url, "--dialect", dialect)
    assert "40/40 succeeded" in out
    # Ten times the slots at once: the server refused some, the Gate waited them out.
    assert number(r"server: yielded (\d+)", out) > 0
    assert_peak_within(out, 4)


def test_governed_stream(serve: Serve) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "200")
    out = run_example("governed_stream.py", "--url", server.url, "--streams", "20")
    assert "20/20 streams completed" in out
    assert number(r"chunks (\d+)", out) == 20 * 4  # the simulated backend's 4 chunks a stream
    assert number(r"server: yielded (\d+)", out) > 0
    assert_peak_within(out, 4)


# -- burst tests -------------------------------------------------------------------------


def test_burst_test_against_a_running_server(serve: Serve, tmp_path: Path) -> None:
    server = serve("--max-inflight", "4", "--exec-ms", "20")
    report = tmp_path / "burst.json"
    target = server.url
    out = run_example(
        "burst_test.py", "--target", target, "--requests", "80", "--json", str(report)
    )
    assert number(r"yieldgate\s+success\s+([\d.]+)%", out) == 100.0
    # One attempt each against 4 slots: most of the naive burst is refused.
    assert number(r"naive\s+success\s+([\d.]+)%", out) < 50.0
    results = json.loads(report.read_text())["results"]
    assert [r["strategy"] for r in results] == ["yieldgate", "naive"]
    assert results[0]["success_rate"] == 1.0
    assert results[1]["yields"] > 0


def test_burst_test_starting_its_own_servers() -> None:
    out = run_example(
        "burst_test.py", "--serve", "--max-inflight 4 --exec-ms 20", "--requests", "40"
    )
    assert "a fresh `yieldgate serve --max-inflight 4 --exec-ms 20` each" in out
    assert number(r"yieldgate\s+success\s+([\d.]+)%", out) == 100.0
    assert number(r"naive\s+success\s+([\d.]+)%", out) < 50.0


# -- the seed scenarios ------------------------------------------------------------------


def test_seed_scenario_against_a_running_server(serve: Serve) -> None:
    server = serve("--max-inflight", "1", "--exec-ms", "300")
    out = run_example("seed_scenario.py", "--target", server.url, "--clients", "6")
    naive, gated = out.split("through a Gate")
    assert "executed 1," in naive
    assert "yielded 5, all within" in naive
    assert "server: admitted 1, yielded 5, peak inflight 1 of 1" in naive
    assert "executed 6," in gated
    assert "peak inflight 1 of 1" in gated
    assert "seed scenario reproduced" in out


def test_seed_scenario_starting_its_own_server() -> None:
    out = run_example("seed_scenario.py", "--exec-s", "0.2", "--clients", "4")
    assert "seed scenario reproduced" in out
    address = re.search(r"listening tcp://([\d.]+):(\d+)", out)
    assert address is not None, out
    # The server it started is gone with it.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((address[1], int(address[2])), timeout=1).close()


def test_cold_start() -> None:
    args = ["--requests", "30", "--cold-start-s", "1", "--ramp-s", "1"]
    out = run_example("cold_start.py", *args, "--max-inflight", "4", "--exec-ms", "100")
    naive, gated = out.split("yieldgate (")
    assert "0/30 succeeded" in naive
    assert "30/30 succeeded" in gated
    assert number(r"([\d.]+) attempts/request", gated) < 2.0


# -- the guard ---------------------------------------------------------------------------


def test_every_example_is_run() -> None:
    source = Path(__file__).read_text(encoding="utf-8")
    run = set(re.findall(r'run_example\(\s*"([\w.]+)"', source))
    examples = {path.name for path in EXAMPLES.glob("*.py")}
    assert examples - run == set(), (
        "examples no test runs: add a test to tests/e2e/test_examples.py"
    )
    assert run - examples == set()


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.py")), ids=lambda p: p.name)
def test_every_example_says_how_to_run_it(path: Path) -> None:
    docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    assert docstring is not None
    assert f"python examples/{path.name}" in docstring

"""Errors that say what to do (issue 30): one line each, the flag's name, the extra to
install, the cause of a failure; status 2 for a wrong flag, 1 for what failed.

Every case runs the real command in a child process. A missing extra is a real
import failure there: a meta path finder installed before ``yieldgate.cli.main``
refuses the module, as an environment without it would.
"""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import run_cli
from yieldgate.cli import _join_values

# Run as ``python -c``: argv[1] the modules to refuse (comma-separated), argv[2] the code.
_BLOCKING = """
import sys

class Refuse:
    def __init__(self, names):
        self.names = names

    def find_spec(self, name, path=None, target=None):
        if any(name == n or name.startswith(n + ".") for n in self.names):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Refuse(set(sys.argv[1].split(","))))
exec(sys.argv[2])
"""


def without(modules: str, code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child process in which ``modules`` cannot be imported."""
    return subprocess.run(
        [sys.executable, "-c", _BLOCKING, modules, code],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli_without(modules: str, *args: str) -> subprocess.CompletedProcess[str]:
    return without(modules, f"from yieldgate.cli import main; sys.exit(main({list(args)!r}))")


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The error: standard error is exactly one line, and no traceback."""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: a connection to it is refused, and no one else
    can take it while the test runs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


# -- a missing extra: the extra and the pip line, status 1 ---------------------------


@pytest.mark.parametrize(
    ("modules", "args", "line"),
    [
        (
            "starlette",
            ["serve", "--port", "0", "--http-port", "0"],
            "yieldgate serve: error: --http-port needs the 'server' extra "
            "(no module named 'starlette'): pip install 'yieldgate[server]'",
        ),
        (
            "rich",
            ["demo", "--no-progress"],
            "yieldgate demo: error: the demo needs the 'burst' extra "
            "(no module named 'rich'): pip install 'yieldgate[burst]'",
        ),
        (
            "matplotlib",
            ["burst", "--serve", "", "-n", "1"],
            "yieldgate burst: error: the burst tool needs the 'burst' extra "
            "(no module named 'matplotlib'): pip install 'yieldgate[burst]'",
        ),
        (
            "torch",
            ["serve", "--port", "0", "--backend", "harness"],
            "yieldgate serve: error: --backend harness needs the 'harness' extra "
            "(no module named 'torch'): pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu, then pip install 'yieldgate[harness]'",
        ),
    ],
)
def test_a_missing_extra_names_it_and_its_pip_line(
    modules: str, args: list[str], line: str
) -> None:
    result = cli_without(modules, *args)
    assert result.returncode == 1, result.stderr
    assert one_line(result) == line


@pytest.mark.parametrize(
    ("modules", "code", "extra"),
    [
        ("redis", "yieldgate.Gate(name='g', shared='redis://127.0.0.1:1')", "fleet"),
        ("torch", "import yieldgate.harness", "harness"),
        ("starlette", "from yieldgate.server import http; http.HttpFront(None, None)", "server"),
        ("httpx2", "yieldgate.http_client(yieldgate.Gate(), flavor='httpx2')", "httpx2"),
    ],
)
def test_the_library_raises_a_typed_import_error(modules: str, code: str, extra: str) -> None:
    check = f"""
import yieldgate
from yieldgate._extras import MissingExtraError
try:
    {code}
except MissingExtraError as exc:
    assert isinstance(exc, ImportError)
    print(exc.extra, exc.name, exc, sep="|")
"""
    result = without(modules, check)
    assert result.returncode == 0, result.stderr
    found, name, message = result.stdout.strip().split("|")
    assert (found, name) == (extra, modules)
    assert f"needs the '{extra}' extra (no module named '{modules}'): pip install" in message
    assert f"'yieldgate[{extra}]'" in message


def test_an_unexpected_error_is_one_line_and_a_traceback_only_in_debug(tmp_path: Path) -> None:
    # A module no extra brings, refused: the command fails in a way nobody planned for.
    args = ["tokenizer", str(tmp_path / "tok")]
    quiet = cli_without("yieldgate.server.tokenizer", *args)
    assert quiet.returncode == 1
    line = one_line(quiet)
    assert line.startswith("yieldgate tokenizer: error: ModuleNotFoundError: ")
    assert line.endswith("(--log-level debug shows where)")
    loud = cli_without("yieldgate.server.tokenizer", *args, "--log-level", "debug")
    assert loud.returncode == 1
    assert "Traceback" in loud.stderr
    assert loud.stderr.splitlines()[-1] == line


# -- an unreachable target ------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["tcp", "openai+http", "raw+http"])
def test_an_unreachable_target_says_so_and_fails(
    scheme: str, refused_port: int, tmp_path: Path
) -> None:
    out, table = tmp_path / "r.json", tmp_path / "r.csv"
    target = f"{scheme}://127.0.0.1:{refused_port}"
    result = run_cli(
        *("burst", "--target", target, "-n", "12", "--no-progress"),
        *("--json", str(out), "--csv", str(table)),
    )
    assert result.returncode == 1, result.stdout + result.stderr
    where = f"127.0.0.1:{refused_port}"
    assert one_line(result) == (
        f"yieldgate burst: error: connection refused to {where}: no request reached the target"
    )
    (r,) = json.loads(out.read_text())["results"]
    assert r["succeeded"] == 0
    assert r["errors_by_kind"]["unreachable"] >= 1
    # A breaker the refusals opened may refuse the rest: counted, but never the first line.
    assert set(r["errors_by_kind"]) <= {"unreachable", "CircuitOpenError"}
    assert r["unreachable"] == f"connection refused to {where}"
    errors_row = next(line for line in result.stdout.splitlines() if "errors by kind" in line)
    assert f"unreachable {r['errors_by_kind']['unreachable']}: connection refused" in errors_row
    assert f"connection refused to {where}" in table.read_text()


# -- flags: their names, their values, their files ------------------------------------


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["serve", "--max-inflight", "0"],
            "yieldgate serve: error: --max-inflight must be >= 1, got 0",
        ),
        (
            ["serve", "--idle-timeout-s", "0"],
            "yieldgate serve: error: --idle-timeout-s must be a positive number",
        ),
        (
            ["serve", "--http-port", "0", "--http-max-connections", "0"],
            "yieldgate serve: error: --http-max-connections must be >= 1",
        ),
        (
            ["burst", "--serve", "", "--sample-ms", "0"],
            "yieldgate burst: error: --sample-ms must be > 0",
        ),
        (
            ["burst", "--serve", "", "--requests", "0"],
            "yieldgate burst: error: --requests must be >= 1",
        ),
        (
            ["serve", "--max-inflight", "x"],
            "yieldgate serve: error: argument --max-inflight: invalid int value: 'x' "
            "(see 'yieldgate serve --help')",
        ),
    ],
)
def test_a_bad_flag_is_named_as_typed(args: list[str], line: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert one_line(result) == line


@pytest.mark.parametrize("flag", ["--json", "--csv", "--plot", "--html"])
def test_an_output_into_a_missing_directory_is_refused(flag: str, tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such"
    result = run_cli("burst", "--serve", "", flag, str(missing / "out"))
    assert result.returncode == 2
    assert one_line(result) == f"yieldgate burst: error: {flag}: directory {missing} does not exist"
    assert not missing.exists()  # and nothing was made


def test_the_demo_refuses_a_missing_directory_too(tmp_path: Path) -> None:
    result = run_cli("demo", "--plot", str(tmp_path / "build" / "demo.png"))
    assert result.returncode == 2
    assert one_line(result) == (
        f"yieldgate demo: error: --plot: directory {tmp_path / 'build'} does not exist"
    )


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs the harness extra")
def test_a_missing_checkpoint_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pt"
    result = run_cli("serve", "--port", "0", "--backend", "harness", "--checkpoint", str(missing))
    assert result.returncode == 2
    assert one_line(result) == f"yieldgate serve: error: --checkpoint: {missing} does not exist"
    junk = tmp_path / "junk.pt"
    junk.write_text("not a checkpoint\n")
    result = run_cli("serve", "--port", "0", "--backend", "harness", "--checkpoint", str(junk))
    assert result.returncode == 2
    assert one_line(result).startswith(
        f"yieldgate serve: error: --checkpoint: cannot load checkpoint {junk}: "
    )


def test_serve_takes_a_value_that_starts_with_a_dash() -> None:
    assert _join_values(["burst", "--serve", "--max-inflight 2", "-n", "3"]) == [
        "burst",
        "--serve=--max-inflight 2",
        "-n",
        "3",
    ]
    # The server was started with the flag: it refuses it, not the burst's parser.
    result = run_cli("burst", "--serve", "--bogus", "-n", "1", "--no-progress")
    assert result.returncode == 2
    line = one_line(result)
    assert "`yieldgate serve --port 0 --grace-s 0 --bogus` did not start" in line
    assert "unrecognized arguments: --bogus" in line


@pytest.mark.parametrize(
    ("command", "shown"),
    [
        ("serve", ["hard cap on executing submits (default: 4)", "(default: 500.0)"]),
        ("burst", ["seed of arrivals, prompts and jitter (default: 0)", "(default: warning)"]),
        ("demo", ["requests per strategy (default: 160)", "(default: demo-plot.png)"]),
        ("tokenizer", ["(default: yieldgate-sim)", "(default: warning)"]),
    ],
)
def test_help_shows_the_defaults(command: str, shown: list[str]) -> None:
    result = run_cli(command, "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())  # as one line: argparse wraps help text
    for words in shown:
        assert words in text

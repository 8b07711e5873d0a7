"""The fenced code blocks of README.md and docs/, as a user copies them, and how to run them.

Shared by tests/test_doc_blocks.py (the main env) and tests/compat/test_doc_recipes.py
(the pinned compat env). A block is what lies between a fence and its closing fence;
its id is ``FILE:LINE`` (the opening fence's line). Whether and how a block runs is
said by its fence's language and, optionally, by one HTML comment on the last
non-blank line before the fence (mkdocs and GitHub render neither):

- ``python``: a complete script, run as a file with this interpreter.
- ``python`` after ``<!-- notebook cell -->``: one cell, run in a real IPython kernel
  (top-level ``await`` allowed there).
- ``sh`` / ``bash``: command lines a pip user types; see ``shell_commands``.
- ``<!-- not run: REASON -->`` before any of those: not run, for the reason given.
- ``<!-- server: ARGS -->``: the block runs against its own ``yieldgate serve ARGS``
  (the one the prose around it names) instead of the shared one.
- Any other language (``text``, ``console``, ``json``, ``toml``, ``yaml``): shown, never run.

The one change made to a block before it runs: a documented address is replaced by the
real one of a server the test started (``PORTS``, ``REDIS``).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_LANGUAGES = frozenset({"python", "sh", "bash"})
SHOWN_LANGUAGES = frozenset({"text", "console", "json", "toml", "yaml", "diff", "ini"})
# The documented addresses, and which started server's address stands in for each.
PORTS = {
    "8000": "http",  # the shared server's HTTP front
    "7070": "tcp",  # the shared server's governed TCP front
    "8001": "http2",  # a second server, for the multi-upstream recipes
    "7071": "tcp2",
}
REDIS = "redis://redis.internal:6379/0"

_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[^\s`]*)\s*$")
_MARKER = re.compile(
    r"^\s*<!--\s*(?P<kind>notebook cell|not run|server)\s*(?::\s*(?P<text>.*?))?\s*-->\s*$"
)
_HEADING = re.compile(r"^#{1,6}\s+(?P<title>.*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    lang: str
    code: str
    marker: str | None  # "notebook cell", "not run" or "server"
    marker_text: str  # the reason, or the server's arguments
    heading: str  # the nearest heading above

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT).as_posix()}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.lang in RUN_LANGUAGES and self.marker != "not run"

    @property
    def is_cell(self) -> bool:
        return self.marker == "notebook cell"


def doc_files() -> list[Path]:
    """README.md and docs/**/*.md, the generated API pages (docs/reference) left out."""
    docs = sorted(p for p in (ROOT / "docs").rglob("*.md") if "reference" not in p.parts)
    return [ROOT / "README.md", *docs]


def blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    heading = ""
    i = 0
    while i < len(lines):
        title = _HEADING.match(lines[i])
        if title:
            heading = title.group("title")
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        indent, end = len(fence.group("indent")), i + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        if end == len(lines):
            raise ValueError(f"{path}:{i + 1}: a fence that never closes")
        previous = next((line for line in reversed(lines[:i]) if line.strip()), "")
        marker = _MARKER.match(previous)
        code = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
        found.append(
            Block(
                path=path,
                line=i + 1,
                lang=fence.group("lang"),
                code=code,
                marker=marker.group("kind") if marker else None,
                marker_text=(marker.group("text") or "") if marker else "",
                heading=heading,
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in doc_files() for block in blocks(path)]


def substitute(code: str, addresses: Mapping[str, str], redis_url: str | None = None) -> str:
    """``code`` with each documented ``HOST:PORT`` (``PORTS``) replaced by the real one."""
    for port, which in PORTS.items():
        if which in addresses:
            code = re.sub(rf"\b(?:127\.0\.0\.1|localhost):{port}\b", addresses[which], code)
    if redis_url is not None:
        code = code.replace(REDIS, redis_url)
    return code


def clean_env() -> dict[str, str]:
    """This environment without provider keys (a snippet must bring its own ``api_key``),
    and without the suite's import path tweaks: a script sees what a user's would."""
    drop = {"OPENAI_API_KEY", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONUNBUFFERED"] = "1"
    env["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # LiteLLM fetches nothing on import
    return env


def run_script(code: str, workdir: Path, timeout: float = 90.0) -> str:
    """Run ``code`` as ``workdir/snippet.py`` with this interpreter: its output, or an
    ``AssertionError`` with the code and all it printed."""
    script = workdir / "snippet.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"ran past {timeout} s:\n{out}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever it started, servers included
    if proc.returncode != 0:
        raise AssertionError(f"exited with {proc.returncode}:\n{code}\n---\n{out}")
    return out


@dataclass(frozen=True)
class Command:
    """One command line of a shell block: its words, comments and continuations gone."""

    words: tuple[str, ...]
    background: bool

    @property
    def text(self) -> str:
        return shlex.join(self.words)


def shell_commands(code: str) -> Iterator[Command]:
    """The command lines of a shell block: ``\\``-continuations joined, ``#`` comments
    (whole lines and trailing) dropped, a trailing ``&`` noted."""
    logical = ""
    for raw in code.splitlines():
        logical += raw.rstrip()
        if logical.endswith("\\"):
            logical = logical[:-1] + " "
            continue
        lexer = shlex.shlex(logical, posix=True, punctuation_chars="&;|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = list(lexer)
        logical = ""
        if not words:
            continue
        background = words[-1] == "&"
        if background:
            words = words[:-1]
        if any(w in {"&", ";", "|", "&&", "||"} for w in words):
            raise ValueError(f"one command per line, please: {raw!r}")
        yield Command(tuple(words), background)

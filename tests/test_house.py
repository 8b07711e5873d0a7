"""The house rules of ``src/yieldgate``: no two modules import each other, no file over 500 lines.

A tie (A imports B and B imports A) is counted however either import is
written: ``import x``, ``from x import y``, relative, inside a function or
under ``if TYPE_CHECKING:``; ``from pkg import name`` counts as importing the
submodule ``pkg.name`` when there is one, else ``pkg`` itself. Untie one by
moving what both need one floor down, into a module both import: an import
moved into a function still counts. A file over 500 lines is split by concept
(STYLE.md, item 6), never by length alone.
"""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
MAX_LINES = 500

# Exceptions to the rules: none. (The tests below fail on an entry that no longer
# applies; add none.)
GATE_TIES_TODAY: set[frozenset[str]] = set()
GATE_LONG_FILES_TODAY: set[str] = set()

# module -> the modules it imports -> the line of the first such import
Graph = dict[str, dict[str, int]]


def _modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Every module of ``package`` under ``src``: dotted name -> (file, is a package)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _base(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` reads from, its dots resolved."""
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    if not is_package:
        parts.pop()  # one dot: this module's own package
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, node.module] if node.module else parts)


def import_graph(src: Path, package: str) -> Graph:
    """Which module of ``package`` imports which, every import statement counted."""
    modules = _modules(src, package)
    graph: Graph = {}
    for module, (path, is_package) in modules.items():
        imported: dict[str, int] = {}
        # ast.walk reaches every statement: in functions, classes, `if TYPE_CHECKING:`.
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _base(module, is_package, node)
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    targets.append(submodule if submodule in modules else base)
            for target in targets:
                if target in modules and target != module:
                    imported.setdefault(target, node.lineno)
        graph[module] = imported
    return graph


def ties(graph: Graph) -> set[frozenset[str]]:
    """Every pair of modules that import each other."""
    return {
        frozenset({a, b}) for a, targets in graph.items() for b in targets if a in graph.get(b, {})
    }


def _describe(tie: frozenset[str], graph: Mapping[str, Mapping[str, int]]) -> str:
    a, b = sorted(tie)
    return f"{a} (line {graph[a][b]}) <-> {b} (line {graph[b][a]})"


def long_files(src: Path, package: str) -> dict[str, int]:
    """Files of ``package`` over ``MAX_LINES`` lines: path under ``src`` -> lines."""
    counts = {
        path.relative_to(src).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path, _ in _modules(src, package).values()
    }
    return {path: n for path, n in counts.items() if n > MAX_LINES}


def test_no_two_modules_import_each_other() -> None:
    graph = import_graph(SRC, "yieldgate")
    found = ties(graph)
    new = sorted(_describe(tie, graph) for tie in found - GATE_TIES_TODAY)
    assert not new, "modules that import each other (move what both need one floor down):\n" + (
        "\n".join(new)
    )
    gone = sorted(" <-> ".join(sorted(tie)) for tie in GATE_TIES_TODAY - found)
    assert not gone, f"untied: take these out of GATE_TIES_TODAY: {gone}"


def test_no_file_is_longer_than_500_lines() -> None:
    found = long_files(SRC, "yieldgate")
    new = {path: n for path, n in found.items() if path not in GATE_LONG_FILES_TODAY}
    assert not new, f"files over {MAX_LINES} lines (split them by concept): {new}"
    gone = sorted(GATE_LONG_FILES_TODAY - set(found))
    assert not gone, (
        f"no longer over {MAX_LINES} lines: take these out of GATE_LONG_FILES_TODAY: {gone}"
    )


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")


def test_every_kind_of_import_makes_a_tie(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg import plain\n",
            "pkg/plain.py": "import pkg.late\n",
            "pkg/late.py": """\
                def f():
                    from pkg import plain
                """,
            "pkg/typed.py": "from pkg import relative\n",
            "pkg/relative.py": """\
                from typing import TYPE_CHECKING

                if TYPE_CHECKING:
                    from . import typed
                """,
            "pkg/sub/__init__.py": "from .deep import name\n",
            "pkg/sub/deep.py": """\
                from .. import sub as _

                name = 1
                """,
            "pkg/star.py": "from pkg.names import *\n",
            "pkg/names.py": "from pkg import star\n",
            "pkg/alone.py": "import pkg.plain\nfrom pkg.plain import x\n",
        },
    )
    graph = import_graph(tmp_path, "pkg")
    assert ties(graph) == {
        frozenset({"pkg.plain", "pkg.late"}),  # `import a.b`; a late import in a function
        frozenset({"pkg.typed", "pkg.relative"}),  # under TYPE_CHECKING; `from . import`
        frozenset({"pkg.sub", "pkg.sub.deep"}),  # a package and a module of its own
        frozenset({"pkg.star", "pkg.names"}),  # `import *`
    }
    # `from pkg import plain` is the submodule, not the package: no tie with pkg.
    assert graph["pkg"] == {"pkg.plain": 1}
    assert graph["pkg.alone"] == {"pkg.plain": 1}


def test_a_long_file_is_found(tmp_path: Path) -> None:
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/long.py": "x = 1\n" * (MAX_LINES + 1)})
    _write(tmp_path, {"pkg/edge.py": "x = 1\n" * MAX_LINES})
    assert long_files(tmp_path, "pkg") == {"pkg/long.py": MAX_LINES + 1}

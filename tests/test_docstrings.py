"""Every public name says what it is for, and the API reference shows no bare entry.

What is public: the names in ``__all__`` of ``yieldgate`` and of its public
packages and modules (``PUBLIC_MODULES``: those without a leading underscore).
Each needs a docstring that says more than its own name.

What the API reference shows: every ``::: identifier`` in docs/reference/, and
under it what mkdocstrings renders with mkdocs.yml's options (names without a
leading underscore; a module's own members and the imported ones its
``__all__`` exports, never its submodules; a class's own members, and its
inherited ones where the page asks for ``inherited_members``). Each of those
members (methods, properties, dataclass and NamedTuple fields, enum members,
instance attributes) needs a docstring of its own (an attribute's is the string
right after it) or a line in its class's ``Attributes:`` section.

The check reads the source with griffe, as mkdocstrings does: it imports
nothing, so it needs neither torch nor starlette.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

griffe: Any = pytest.importorskip("griffe")

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "reference"

PUBLIC_MODULES = (
    "yieldgate",
    "yieldgate.protocol",
    "yieldgate.gate",
    "yieldgate.fleet",
    "yieldgate.server",
    "yieldgate.dialects",
    "yieldgate.transports",
    "yieldgate.burst",
    "yieldgate.harness",
    "yieldgate.cli",
)


def load(src: Path = ROOT / "src", package: str = "yieldgate") -> Any:
    loader = griffe.GriffeLoader(search_paths=[str(src)], docstring_parser=griffe.Parser.google)
    module = loader.load(package)
    loader.resolve_aliases(external=False, implicit=False)
    return module


def member(root: Any, path: str) -> Any:
    obj = root
    for part in path.split(".")[1:]:
        obj = obj.members[part]
    return obj


def target(obj: Any) -> Any:
    return obj.final_target if obj.is_alias else obj


def _words(text: str) -> str:
    return re.sub(r"[\W_]+", " ", text).strip().lower()


def says_something(name: str, docstring: str) -> bool:
    """A docstring that is not empty and not just the name again."""
    return bool(docstring.strip()) and _words(docstring) != _words(name)


def docstring(obj: Any) -> str:
    found = target(obj).docstring
    return found.value if found else ""


def attributes_section(cls: Any) -> dict[str, str]:
    """The names, with their descriptions, of a class docstring's ``Attributes:`` section."""
    found = target(cls).docstring
    if not found:
        return {}
    return {
        attribute.name: attribute.description
        for section in found.parsed
        if section.kind is griffe.DocstringSectionKind.attributes
        for attribute in section.value
    }


def rendered_members(obj: Any, *, inherited: bool) -> Iterator[Any]:
    """The members mkdocstrings renders under ``obj``, with mkdocs.yml's options."""
    real = target(obj)
    if not (real.is_module or real.is_class):
        return
    members = dict(real.members)
    if real.is_class and inherited:
        for name, found in real.inherited_members.items():
            members.setdefault(name, found)
    for name, found in members.items():
        if name.startswith("_"):
            continue
        if found.is_alias and found.is_imported and not found.is_public:
            continue
        if found.is_module:
            continue
        yield found


def bare_entries(root: Any, identifier: str, *, inherited: bool = False) -> list[str]:
    """The entries under ``::: identifier`` that say nothing, as ``parent.name``."""
    bare: list[str] = []
    seen: set[str] = set()

    def visit(obj: Any, path: str, section: dict[str, str]) -> None:
        if path in seen:
            return
        seen.add(path)
        name = path.rsplit(".", 1)[-1]
        if not (
            says_something(name, docstring(obj)) or says_something(name, section.get(name, ""))
        ):
            bare.append(path)
        own = attributes_section(obj) if target(obj).is_class else {}
        for found in rendered_members(obj, inherited=inherited):
            visit(found, f"{path}.{found.name}", own)

    visit(member(root, identifier), identifier, {})
    return bare


def reference_directives(reference: Path = REFERENCE) -> list[tuple[str, bool]]:
    """Each ``::: identifier`` of the reference pages, and whether it shows inherited members."""
    found: list[tuple[str, bool]] = []
    for page in sorted(reference.glob("*.md")):
        text = page.read_text(encoding="utf-8")
        for match in re.finditer(r"^::: (\S+)\n((?:[ \t]+.*\n|\n)*)", text, re.MULTILINE):
            options = match.group(2)
            found.append((match.group(1), "inherited_members: true" in options))
    return found


@pytest.fixture(scope="module")
def yieldgate_source() -> Any:
    return load()


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_exported_name_has_a_docstring(module: str, yieldgate_source: Any) -> None:
    found = member(yieldgate_source, module)
    assert docstring(found), f"{module} has no module docstring"
    exports = [e if isinstance(e, str) else e.name for e in found.exports or ()]
    assert exports, f"{module} has no __all__"
    names = [n for n in exports if not n.startswith("__")]
    assert [n for n in names if not says_something(n, docstring(found.members[n]))] == []


def test_the_reference_covers_every_documented_module() -> None:
    identifiers = {identifier for identifier, _ in reference_directives()}
    assert {"yieldgate", "yieldgate.protocol", "yieldgate.server"} <= identifiers


@pytest.mark.parametrize(
    ("identifier", "inherited"), reference_directives(), ids=[i for i, _ in reference_directives()]
)
def test_every_entry_of_the_api_reference_has_a_docstring(
    identifier: str, inherited: bool, yieldgate_source: Any
) -> None:
    assert bare_entries(yieldgate_source, identifier, inherited=inherited) == []


def test_the_check_catches_a_bare_field_a_bare_method_and_a_docstring_that_echoes(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        textwrap.dedent(
            '''
            """A package."""
            from dataclasses import dataclass

            __all__ = ["Record", "helper"]


            @dataclass
            class Record:
                """A record.

                Attributes:
                    listed: Documented in the class docstring.
                """

                said: int = 0
                """Documented after the field."""
                listed: int = 0
                bare: int = 0

                def method(self) -> None:
                    """Method."""


            def helper() -> None:
                """Helps."""


            def _private() -> None:
                pass
            '''
        )
    )
    root = load(tmp_path, "pkg")
    assert bare_entries(root, "pkg") == ["pkg.Record.bare", "pkg.Record.method"]
    assert says_something("max_inflight", "Max inflight.") is False

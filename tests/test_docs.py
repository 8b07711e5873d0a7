"""The docs site: every page in the nav and linked from home, every nav entry a page.

``make docs`` (mkdocs --strict) catches the same orphans; these checks also run
when pytest runs alone, and need neither mkdocs nor a build.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

import yieldgate
from yieldgate.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"


class _Loader(yaml.SafeLoader):
    """A safe loader that reads tags it does not know (``!!python/name:``, ``!ENV``) as None."""


_Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
_Loader.add_multi_constructor("!", lambda loader, suffix, node: None)


def load_config(path: Path = ROOT / "mkdocs.yml") -> dict[str, Any]:
    config: dict[str, Any] = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    return config


def nav_pages(items: list[Any]) -> list[str]:
    """The local pages a mkdocs nav lists, in order (external links left out)."""
    pages: list[str] = []
    for item in items:
        values = item.values() if isinstance(item, dict) else [item]
        for value in values:
            if isinstance(value, str):
                if "://" not in value:
                    pages.append(value)
            else:
                pages.extend(nav_pages(value))
    return pages


def excluded_dirs(config: dict[str, Any]) -> list[str]:
    """``exclude_docs`` patterns, which must all name a folder as ``/folder/``."""
    patterns = [p.strip() for p in (config.get("exclude_docs") or "").splitlines() if p.strip()]
    for pattern in patterns:
        assert re.fullmatch(r"/[\w.-]+(/[\w.-]+)*/", pattern), f"unsupported pattern {pattern!r}"
    return [p.strip("/") + "/" for p in patterns]


def doc_pages(docs: Path, config: dict[str, Any]) -> set[str]:
    skip = excluded_dirs(config)
    pages = {p.relative_to(docs).as_posix() for p in docs.rglob("*.md")}
    return {p for p in pages if not any(p.startswith(d) for d in skip)}


def orphans_and_missing(root: Path) -> tuple[set[str], set[str]]:
    config = load_config(root / "mkdocs.yml")
    docs = root / config.get("docs_dir", "docs")
    listed = nav_pages(config["nav"])
    pages = doc_pages(docs, config)
    return pages - set(listed), {p for p in listed if not (docs / p).is_file()}


def test_the_site_is_strict_and_offline() -> None:
    config = load_config()
    assert config["strict"] is True
    assert config["theme"]["name"] == "material"
    assert config["theme"]["font"] is False
    # page.html, not page/: the built site's links work when it is opened from disk.
    assert config["use_directory_urls"] is False


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    orphans, missing = orphans_and_missing(ROOT)
    assert not orphans, f"pages missing from mkdocs.yml's nav: {sorted(orphans)}"
    assert not missing, f"nav entries with no page: {sorted(missing)}"


def test_the_nav_check_catches_a_stray_page_and_a_dead_entry(tmp_path: Path) -> None:
    (tmp_path / "docs" / "recipes").mkdir(parents=True)
    (tmp_path / "docs" / "index.md").write_text("# Home\n")
    (tmp_path / "docs" / "recipes" / "stray.md").write_text("# Stray\n")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\n"
        "markdown_extensions:\n"
        "  - pymdownx.superfences:\n"
        "      custom_fences:\n"
        "        - format: !!python/name:pymdownx.superfences.fence_code_format\n"
        "nav:\n"
        "  - Home: index.md\n"
        "  - Recipes:\n"
        "      - Gone: recipes/gone.md\n"
        "  - GitHub: https://example.com/\n"
    )
    assert orphans_and_missing(tmp_path) == ({"recipes/stray.md"}, {"recipes/gone.md"})


def unlinked_from_home(root: Path) -> list[str]:
    """The nav's pages that the home page (the nav's first) does not link to."""
    config = load_config(root / "mkdocs.yml")
    docs = root / config.get("docs_dir", "docs")
    home, *pages = nav_pages(config["nav"])
    text = (docs / home).read_text(encoding="utf-8")
    linked = {m.split("#", 1)[0] for m in re.findall(r"\]\(([^)\s]+)\)", text)}
    return [p for p in pages if p not in linked]


def test_the_home_page_links_every_page_of_the_nav() -> None:
    assert unlinked_from_home(ROOT) == []


def test_the_home_page_check_catches_a_guide_left_out(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\n[Fleets](fleet.md#top)\n")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\nnav:\n  - Home: index.md\n  - Fleets: fleet.md\n  - Quotas: quotas.md\n"
    )
    assert unlinked_from_home(tmp_path) == ["quotas.md"]


def _section(text: str, heading: str) -> str:
    """The body under ``heading`` up to the next heading of the same or a higher level."""
    level = heading.split(" ", 1)[0]
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    after = re.search(rf"\n#{{1,{len(level)}}} ", text[start:])
    return text[start : start + after.start()] if after else text[start:]


def _policy_classes() -> list[type]:
    """GatePolicy and every policy dataclass its fields hold."""
    found: list[type] = [yieldgate.GatePolicy]
    for hint in typing.get_type_hints(yieldgate.GatePolicy).values():
        args = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
        found += [a for a in args if dataclasses.is_dataclass(a) and a not in found]
    return found


@pytest.mark.parametrize("policy", _policy_classes(), ids=lambda c: c.__name__)
def test_the_configuration_reference_lists_every_policy_field(policy: type) -> None:
    section = _section(CONFIGURATION.read_text(encoding="utf-8"), f"### `{policy.__name__}`")
    names = [f.name for f in dataclasses.fields(policy)]
    assert [n for n in names if f"| `{n}` |" not in section] == []


@pytest.mark.parametrize("command", ["serve", "burst", "demo", "tokenizer"])
def test_the_configuration_reference_lists_every_flag(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    usage = capsys.readouterr().out.split("\n\n", 1)[0]
    flags = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", usage)) - {"--help"}
    section = _section(CONFIGURATION.read_text(encoding="utf-8"), f"## `yieldgate {command}`")
    assert flags
    assert sorted(f for f in flags if f"`{f}" not in section) == []

"""The framework recipes of the docs, run as written with the pinned versions (compat env).

Every ``python`` block of docs/recipes/frameworks.md, and every block elsewhere that
imports a client only this env has (text-generation), runs as a script against a real
``yieldgate serve`` with its HTTP front, as tests/test_doc_blocks.py runs them in the main
env (the newest versions pip picks: LiteLLM and pydantic-ai run there too). The one change
to a block: the documented ``127.0.0.1:8000`` becomes the server's real address.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.docblocks import ROOT, Block, all_blocks, run_script, substitute
from yieldgate.server import spawn

COMPAT_IMPORTS = ("text_generation",)
RECIPES = [
    b
    for b in all_blocks()
    if b.runs
    and b.lang == "python"
    and not b.is_cell
    and (
        b.path == ROOT / "docs" / "recipes" / "frameworks.md"
        or any(re.search(rf"^\s*(from|import) {m}\b", b.code, re.M) for m in COMPAT_IMPORTS)
    )
]


def test_the_recipes_are_found() -> None:
    assert len(RECIPES) >= 6, [b.id for b in RECIPES]


@pytest.fixture(scope="module")
def addresses() -> Iterator[dict[str, str]]:
    with spawn("--max-inflight", "4", "--exec-ms", "20", http=True) as server:
        assert server.http_address is not None
        yield {"http": "{}:{}".format(*server.http_address), "tcp": f"{server.host}:{server.port}"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", RECIPES, ids=[b.id for b in RECIPES])
def test_recipe(block: Block, addresses: dict[str, str], tmp_path: Path) -> None:
    run_script(substitute(block.code, addresses), tmp_path)

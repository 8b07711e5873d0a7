"""The compat environment: clients that cannot share the main env, under a Gate.

openai 2.x (built on httpx), LiteLLM and the frameworks of
docs/recipes/frameworks.md (LangChain, LlamaIndex, pydantic-ai; each pins
openai below 3), and HuggingFace's text-generation client (on aiohttp; it pins
huggingface_hub below 1.0) live in ``.venv-compat``, pinned by
``compat/requirements.txt``. ``make compat`` builds it and runs this directory;
the main suite ignores it (pyproject's ``addopts``). Run anywhere else, it stops
at once and says where it belongs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest

from tests.compat.burst import SLOTS
from yieldgate.server import ServerProcess, spawn

# LiteLLM fetches its model price map from GitHub when imported, unless told not to;
# these tests make no request off the machine.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def _version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


REQUIREMENTS = Path(__file__).resolve().parents[2] / "compat" / "requirements.txt"
# What tests/compat imports; compat/requirements.txt pins each.
DISTRIBUTIONS = (
    "openai",
    "anthropic",
    "litellm",
    "text-generation",
    "langchain-openai",
    "langchain-anthropic",
    "llama-index-llms-openai",
    "pydantic-ai-slim",
)


def _pinned() -> dict[str, str]:
    """compat/requirements.txt's ``name[extras]==version`` lines, by name."""
    pins = {}
    for line in REQUIREMENTS.read_text(encoding="utf-8").splitlines():
        found = re.fullmatch(r"([A-Za-z0-9._-]+)(?:\[[^\]]*\])?==(\S+)", line.strip())
        if found is not None:
            pins[found.group(1)] = found.group(2)
    return pins


def pytest_configure(config: pytest.Config) -> None:
    found = {name: _version(name) for name in DISTRIBUTIONS}
    if any(v is None for v in found.values()) or not str(found["openai"]).startswith("2."):
        raise pytest.UsageError(
            f"tests/compat runs in .venv-compat (`make compat`), not here: found {found}"
        )
    pins = _pinned()
    stale = {name: (v, pins.get(name)) for name, v in found.items() if v != pins.get(name)}
    if stale:
        raise pytest.UsageError(
            "the compat env does not match compat/requirements.txt (installed, pinned): "
            f"{stale}; rebuild it (`make compat`)"
        )


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A server with few slots (``SLOTS``): a burst of ``CALLS`` overloads it."""
    with spawn("--max-inflight", str(SLOTS), "--exec-ms", "20", http=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def yielding_server() -> Iterator[ServerProcess]:
    """A server that yields every call (a cold start of 10 minutes), hinting minutes ahead.

    Its OpenAI routes answer 429, its Anthropic route 529 ``overloaded_error``.
    A Gate allowed a second or so gives up at once: the hint is past its deadline.
    """
    with spawn("--max-inflight", str(SLOTS), "--cold-start-s", "600", http=True) as proc:
        yield proc

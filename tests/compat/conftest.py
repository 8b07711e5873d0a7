"""The compat environment: clients that cannot share the main env, under a Gate.

openai 2.x (built on httpx), LiteLLM (it pins openai below 3) and HuggingFace's
text-generation client (on aiohttp; it pins huggingface_hub below 1.0) live in
``.venv-compat``, pinned by ``compat/requirements.txt``. ``make compat`` builds
it and runs this directory; the main suite ignores it (pyproject's ``addopts``).
Run anywhere else, it stops at once and says where it belongs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from importlib import metadata

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


def pytest_configure(config: pytest.Config) -> None:
    found = {name: _version(name) for name in ("openai", "litellm", "text-generation")}
    if any(v is None for v in found.values()) or not str(found["openai"]).startswith("2."):
        raise pytest.UsageError(
            f"tests/compat runs in .venv-compat (`make compat`), not here: found {found}"
        )


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    """A server with few slots (``SLOTS``): a burst of ``CALLS`` overloads it."""
    with spawn("--max-inflight", str(SLOTS), "--exec-ms", "20", http=True) as proc:
        yield proc

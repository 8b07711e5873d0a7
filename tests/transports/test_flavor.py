"""Which library a gated client is built on, when nobody names one.

The installed openai (3.x here) and huggingface_hub (2.x) declare httpx2; the
openai 2.x line declares httpx. A distribution's declared requirements decide,
so a 2.x install is reproduced by its metadata alone, in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import httpx2
import pytest

from yieldgate import Gate, http_client
from yieldgate.transports._flavor import detect_flavor, flavor_of_distribution


def test_the_installed_clients_declare_their_library() -> None:
    assert flavor_of_distribution("openai") == "httpx2"
    assert flavor_of_distribution("huggingface_hub") == "httpx2"
    # yieldgate itself needs httpx; its httpx2 extra does not count.
    assert flavor_of_distribution("yieldgate") == "httpx"
    assert flavor_of_distribution("no-such-distribution") is None


def test_a_transport_decides_before_any_installed_client() -> None:
    assert detect_flavor(inner=httpx.MockTransport(lambda request: None)) == "httpx"
    assert detect_flavor(inner=httpx2.HTTPTransport()) == "httpx2"
    assert detect_flavor(inner=object()) == "httpx2"  # neither library's: the installed openai's
    assert detect_flavor(client="huggingface_hub") == "httpx2"


def fake_distribution(root: Path, name: str, version: str, *requires: str) -> Path:
    """A site directory holding only ``name``'s metadata: what pip leaves for its requirements."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    lines = [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}"]
    lines += [f"Requires-Dist: {requirement}" for requirement in requires]
    (info / "METADATA").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


CHECK = """
import yieldgate
gate = yieldgate.Gate(name="detect")
print(type(yieldgate.http_client(gate)).__module__.split(".")[0],
      type(yieldgate.http_client(gate, sync=True)).__module__.split(".")[0],
      type(yieldgate.openai_client(gate, api_key="k")._client).__module__.split(".")[0])
"""


def run_with(site: Path) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, env=env, check=True
    )
    return result.stdout.strip()


def test_the_openai_2_line_gets_an_httpx_client(tmp_path: Path) -> None:
    # openai 2.x, as LiteLLM pins it, requires httpx and refuses httpx2 clients.
    site = fake_distribution(
        tmp_path, "openai", "2.54.0", "httpx<1,>=0.23.0", "anyio<5,>=3.5.0", "pydantic<3,>=1.9.0"
    )
    assert run_with(site) == "httpx httpx httpx"


def test_the_openai_3_line_gets_an_httpx2_client(tmp_path: Path) -> None:
    site = fake_distribution(tmp_path, "openai", "3.54.0", "httpx2<3,>=2.12.0")
    assert run_with(site) == "httpx2 httpx2 httpx2"


@pytest.mark.parametrize(
    ("requires", "expected"),
    [(("httpx>=0.27",), httpx.AsyncClient), (("httpx2>=2",), httpx2.AsyncClient)],
)
def test_huggingface_hub_gets_the_library_its_line_declares(
    tmp_path: Path, requires: tuple[str, ...], expected: type
) -> None:
    # huggingface_hub 1.x is built on httpx, 2.x on httpx2.
    site = fake_distribution(tmp_path, "huggingface_hub", "1.33.0", *requires)
    code = (
        "import sys, yieldgate.transports._flavor as f; "
        "print(f.detect_flavor(client='huggingface_hub'))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert result.stdout.strip() == expected.__module__.split(".")[0]


def test_a_named_flavor_wins() -> None:
    gate = Gate(name="named")
    assert isinstance(http_client(gate, flavor="httpx"), httpx.AsyncClient)
    assert isinstance(http_client(gate, flavor="httpx", sync=True), httpx.Client)

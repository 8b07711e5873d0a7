"""The package as a pip user gets it: the built wheel and sdist, and every install line
of the README's pip section, each in a fresh virtual environment.

The wheel is built from this tree (``python -m build --no-isolation``: the backend and
its readme plugin come from the dev group, so nothing is fetched to build it). Each use
of the README (a block of its pip section) gets a new venv, without pip of its own, into
which this environment's pip installs the wheel with that use's extras, so the
dependencies come from the package index (pip's cache makes repeats quick). One
substitution: the harness block's ``torch --index-url https://download.pytorch.org/whl/cpu``
becomes the Makefile's pinned CPU wheel, which this machine's pip finds on disk, since
PyTorch's index is not reachable from CI.
"""

from __future__ import annotations

import email.parser
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import yieldgate

pytestmark = pytest.mark.install

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = {"server", "burst", "fleet", "harness", "httpx2"}
TORCH_INDEX = "torch --index-url https://download.pytorch.org/whl/cpu"
TORCH_PIN = re.search(r"^TORCH := (\S+)$", (ROOT / "Makefile").read_text(), re.M)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (found,) = dist.glob("yieldgate-*.whl")
    return found


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_wheel_carries_the_license_urls_classifiers_and_only_user_extras(
    wheel: Path,
) -> None:
    meta = _metadata(wheel)
    assert meta["Version"] == yieldgate.__version__
    assert meta["License-Expression"] == "Apache-2.0"
    with zipfile.ZipFile(wheel) as archive:
        licenses = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        (license_name,) = licenses
        assert b"Apache License" in archive.read(license_name)
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL") or [])
    assert {"Homepage", "Documentation", "Source", "Issues", "Changelog"} <= set(urls)
    assert set(meta.get_all("Provides-Extra") or []) == PUBLISHED
    classifiers = meta.get_all("Classifier") or []
    for minor in (11, 12, 13):
        assert f"Programming Language :: Python :: 3.{minor}" in classifiers
    assert meta["Requires-Python"] == ">=3.11"


def test_the_package_page_has_no_link_or_image_that_only_works_in_the_repository(
    wheel: Path,
) -> None:
    description = _metadata(wheel).get_payload()
    assert isinstance(description, str)
    assert "## Install with pip" in description
    targets = re.findall(r"\]\(([^)\s]+)\)", description)
    assert len(targets) > 15  # the README's links are all there...
    relative = [t for t in targets if not t.startswith(("https://", "http://", "#"))]
    assert relative == []  # ...and none is relative
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", description)
    assert images
    assert all(i.startswith("https://raw.githubusercontent.com/") for i in images)


def test_the_sdist_has_the_license_and_no_ci_files(dist: Path) -> None:
    (sdist,) = dist.glob("yieldgate-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = [n.split("/", 1)[1] for n in archive.getnames() if "/" in n]
    assert "LICENSE" in names
    assert "pyproject.toml" in names
    assert "src/yieldgate/__init__.py" in names
    assert not [n for n in names if n.startswith((".ci", ".github", ".venv"))]
    assert not [n for n in names if "__pycache__" in n]


def readme_uses() -> list[list[str]]:
    """The README's pip section: its blocks, each a list of pip commands."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Install with pip", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    uses: list[list[str]] = [[]]
    for line in block.splitlines():
        line = line.strip()
        if not line:
            if uses[-1]:
                uses.append([])
        elif not line.startswith("#"):
            assert line.startswith("pip install "), line
            uses[-1].append(line)
    return [use for use in uses if use]


def _extras(use: list[str]) -> set[str]:
    found = set()
    for command in use:
        match = re.search(r"yieldgate\[([a-z0-9,]+)\]", command)
        if match:
            found |= set(match.group(1).split(","))
    return found


def test_the_readme_has_one_block_per_use() -> None:
    assert [sorted(_extras(use)) for use in readme_uses()] == [
        [], ["server"], ["burst", "server"], ["fleet"], ["harness", "server"]
    ]  # fmt: skip


@pytest.fixture
def venv(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    yield path
    shutil.rmtree(path, ignore_errors=True)  # the harness's holds torch: about 900 MB


def _install(venv: Path, command: str, wheel: Path) -> None:
    assert TORCH_PIN is not None
    command = command.replace(TORCH_INDEX, TORCH_PIN.group(1))
    args = command.split()[2:]  # after "pip install"
    args = [a.strip("'").replace("yieldgate", str(wheel), 1) for a in args]
    args = [a for a in args if a]
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--quiet", "--disable-pip-version-check", *args],
        check=True, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def _run(venv: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    exe = venv / "bin" / args[0]
    return subprocess.run(
        [str(exe), *args[1:]], capture_output=True, text=True, timeout=timeout, check=False
    )


def _one_line_asking_for(result: subprocess.CompletedProcess[str], extra: str) -> None:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"pip install 'yieldgate[{extra}]'" in lines[0]


def _serve_starts(venv: Path, *flags: str, lines: int = 1) -> str:
    """``yieldgate serve`` on free ports: the first ``lines`` it prints, then stopped."""
    server = subprocess.Popen(
        [str(venv / "bin" / "yieldgate"), "serve", "--port", "0", *flags],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        first = "".join(server.stdout.readline() for _ in range(lines))
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return first


FLEET_GATE = (
    "import yieldgate; g = yieldgate.Gate(name='g', shared='redis://127.0.0.1:1'); "
    "print(type(g).__name__)"
)


@pytest.mark.parametrize(
    "use", readme_uses(), ids=lambda use: "+".join(sorted(_extras(use))) or "sdk"
)
def test_each_install_line_of_the_readme_in_a_fresh_venv(
    use: list[str], venv: Path, wheel: Path
) -> None:
    for command in use:
        _install(venv, command, wheel)
    extras = _extras(use)
    version = _run(venv, "python", "-c", "import yieldgate; print(yieldgate.__version__)")
    assert version.stdout.strip() == yieldgate.__version__, version.stderr
    cli = _run(venv, "yieldgate", "--version")
    assert cli.stdout.strip() == f"yieldgate {yieldgate.__version__}", cli.stderr
    for command in ([], ["serve"], ["burst"]):
        shown = _run(venv, "yieldgate", *command, "--help")
        assert shown.returncode == 0, shown.stderr
        assert "usage: yieldgate" in shown.stdout

    if "server" in extras:
        assert "listening http://127.0.0.1:" in _serve_starts(venv, "--http-port", "0", lines=2)
    else:
        _one_line_asking_for(_run(venv, "yieldgate", "serve", "--http-port", "0"), "server")
    if "burst" in extras:
        out = venv.parent / "burst.json"
        burst = _run(
            venv, "yieldgate", "burst", "--target", "tcp://", "--requests", "8",
            "--serve=--max-inflight 2 --exec-ms 5", "--no-progress", "--json", str(out),
            timeout=300,
        )  # fmt: skip
        assert burst.returncode == 0, burst.stderr
        assert out.stat().st_size > 0
    else:
        _one_line_asking_for(
            _run(venv, "yieldgate", "burst", "--target", "tcp://", "--requests", "1"), "burst"
        )
    if "harness" in extras:
        assert "listening tcp://127.0.0.1:" in _serve_starts(venv, "--backend", "harness")
    else:
        _one_line_asking_for(
            _run(venv, "yieldgate", "serve", "--port", "0", "--backend", "harness"), "harness"
        )
    fleet = _run(venv, "python", "-c", FLEET_GATE)
    if "fleet" in extras:
        assert fleet.stdout.strip() == "Gate", fleet.stderr
    else:
        assert fleet.returncode != 0
        assert "pip install 'yieldgate[fleet]'" in fleet.stderr.strip().splitlines()[-1]

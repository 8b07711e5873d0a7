"""``yieldgate._extras.require``: a missing module names its extra; anything else about an
import is left as it is."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from yieldgate._extras import MissingExtraError, install_line, require


def test_a_missing_module_of_an_extra_names_the_extra_and_its_pip_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "redis", None)  # import redis -> ModuleNotFoundError
    with pytest.raises(MissingExtraError) as caught:
        require("redis", "a Gate's shared=")
    assert caught.value.extra == "fleet"
    assert caught.value.name == "redis"
    assert str(caught.value) == (
        "a Gate's shared= needs the 'fleet' extra (no module named 'redis'): "
        "pip install 'yieldgate[fleet]'"
    )
    assert isinstance(caught.value, ImportError)


def test_the_harness_line_installs_the_cpu_build_of_torch_first() -> None:
    assert install_line("harness").startswith(
        "pip install torch --index-url https://download.pytorch.org/whl/cpu, then "
    )


def test_a_broken_installed_module_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Installed, but its own import fails (a wrong version, say): no extra would mend that.
    (tmp_path / "yg_broken_module.py").write_text("from os import no_such_name\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ImportError) as caught:
        require("yg_broken_module", "something")
    assert not isinstance(caught.value, MissingExtraError)
    assert "no_such_name" in str(caught.value)


def test_a_module_whose_own_dependency_is_missing_names_that_dependency(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "yg_needs_more.py").write_text("import yg_not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtraError) as caught:
        require("yg_needs_more", "something")
    assert caught.value.name == "yg_not_installed_anywhere"
    assert caught.value.extra is None
    assert "needs the yg_not_installed_anywhere package" in str(caught.value)

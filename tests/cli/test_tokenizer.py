"""``yieldgate tokenizer`` as a user runs it: the files, the default directory, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from yieldgate.cli import main


def test_writes_the_files_and_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "tok"
    assert main(["tokenizer", str(target), "--model", "tiny", "--max-length", "2048"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(target / "tokenizer.json"), str(target / "tokenizer_config.json")]
    config = json.loads((target / "tokenizer_config.json").read_text())
    assert (config["name_or_path"], config["model_max_length"]) == ("tiny", 2048)


def test_the_directory_defaults_to_the_model_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # So that a tool given the served model's name as its tokenizer finds it from here.
    monkeypatch.chdir(tmp_path)
    assert main(["tokenizer"]) == 0
    assert (tmp_path / "yieldgate-sim" / "tokenizer.json").is_file()


def test_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tokenizer", str(tmp_path), "--max-length", "0"]) == 2
    assert "model_max_length must be >= 1" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["tokenizer", str(blocker / "sub")]) == 2
    assert "cannot write" in capsys.readouterr().err

"""Trace files: each line checked, errors naming the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from yieldgate.burst._trace import load_trace


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "x"}', "line 1: offset_s must be a number"),
        ('{"offset_s": -1}', "line 1: offset_s must be a finite number >= 0"),
        ('{"offset_s": 0, "prompt": "x", "prompt_chars": 3}', "not both"),
        ('{"offset_s": 0, "prompt_chars": 0}', "prompt_chars must be >= 1"),
        ('{"offset_s": 0, "prompt_chars": 2.5}', "prompt_chars must be an integer"),
        ('{"offset_s": 0, "max_tokens": 0}', "max_tokens must be >= 1"),
        ('{"offset_s": 0, "tokens": 3}', "unknown key 'tokens'"),
        ('{"offset_s": 0}\n[1]', "line 2: each line must be a JSON object"),
        ('{"offset_s": 0}\n{"offset_s": ', "line 2: not JSON"),
        ("\n\n", "has no entries"),
    ],
)
def test_bad_traces_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_trace(trace)


def test_a_missing_trace_or_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read it"):
        load_trace(tmp_path / "nope.jsonl")

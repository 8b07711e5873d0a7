"""A griffe extension for the API reference: docstring examples as code blocks.

The docstrings in ``src/`` are prose with reStructuredText habits: doctest
lines (``>>> ...``) and literal blocks introduced by ``::``. Markdown reads the
first as nested block quotes and shows the second's ``::``. This rewrites
both, in the copy mkdocstrings renders, as fenced Python blocks; the source
files are not touched. Loaded by mkdocs.yml (``extensions:`` of the handler).
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_PROMPT = re.compile(r"^(?:>>>|\.\.\.)(?: |$)")
_DOCTEST_FLAGS = re.compile(r"\s*#\s*doctest:.*$")


def _fence(lines: list[str]) -> list[str]:
    return ["```python", *lines, "```"]


def rewrite(text: str) -> str:
    """``text`` with its doctest runs and ``::`` literal blocks fenced."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if _PROMPT.match(line):
            block = []
            while i < len(lines) and _PROMPT.match(lines[i]):
                block.append(_DOCTEST_FLAGS.sub("", lines[i][4:]))
                i += 1
            out.extend(_fence(block))
            continue
        if line.rstrip().endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith(" ")):
                j += 1
            body = textwrap.dedent("\n".join(lines[i + 1 : j])).strip("\n")
            if body:
                out.append(line.rstrip()[:-1])
                out.append("")
                out.extend(_fence(body.split("\n")))
                out.append("")
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestFences(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)

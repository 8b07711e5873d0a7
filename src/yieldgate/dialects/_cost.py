"""What a request will cost of a provider's token quota, read from its body.

Providers meter a request at its door by its prompt and by the output it may
produce: OpenAI counts the prompt's tokens (estimated, about one per four
characters) plus ``max_tokens`` (or ``max_completion_tokens``), whatever the
answer then uses. The estimate here does the same from the JSON bodies of
the APIs the dialects speak:

- chat (OpenAI, Anthropic, HF's chat route): ``messages`` (each ``role: content``,
  text parts of a content array, one message per line) and Anthropic's
  ``system``; output ``max_completion_tokens``, ``max_tokens``;
- completions: ``prompt`` (a string or a list of them);
- TGI and HF's ``generate``: ``inputs``, output ``parameters.max_new_tokens``;
- OpenAI's Responses API: ``input`` (a string, or messages and text parts) and
  ``instructions``, ``max_output_tokens``;
- embeddings (a path ending ``/embeddings``): ``input``, and no output.

A request that sets no output bound is charged ``default_output_tokens``.
``count_tokens`` replaces the four-characters rule with a real tokenizer
(tiktoken's ``encode``, say). A body that is not JSON, or not one of these
shapes, costs one request and no tokens: the headers still correct the count.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from yieldgate.gate import Cost, QuotaPolicy

__all__ = ["estimate_cost", "prompt_text", "usage_of"]

_OUTPUT_FIELDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _input_item(item: Any) -> str:
    """One item of a Responses API ``input`` list: a message (``role`` and
    ``content``, a string or ``input_text`` parts) or a bare text part."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        if "content" in item:
            return f"{item.get('role', '')}: {_text_of(item['content'])}"
        text = item.get("text")
        if isinstance(text, str):
            return text
    return ""


def prompt_text(body: dict[str, Any]) -> str | None:
    """The prompt of a request body as the provider counts it, or ``None``."""
    messages = body.get("messages")
    if isinstance(messages, list):
        lines = [
            f"{m.get('role', '')}: {_text_of(m.get('content'))}"
            for m in messages
            if isinstance(m, dict)
        ]
        system = _text_of(body.get("system"))
        if system:
            lines.insert(0, f"system: {system}")
        return "\n".join(lines)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    inputs = body.get("inputs")
    if isinstance(inputs, str):
        return inputs
    given = body.get("input")
    if isinstance(given, str | list):
        instructions = body.get("instructions")
        text = given if isinstance(given, str) else "\n".join(_input_item(m) for m in given)
        return f"{instructions}\n{text}" if isinstance(instructions, str) else text
    return None


def _output_bound(body: dict[str, Any]) -> int | None:
    for name in _OUTPUT_FIELDS:
        value = body.get(name)
        if type(value) is int and value >= 0:
            return value
    parameters = body.get("parameters")
    if isinstance(parameters, dict):
        value = parameters.get("max_new_tokens")
        if type(value) is int and value >= 0:
            return value
    return None


_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_COUNT = re.compile(
    rb'"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*([0-9]{1,12})'
)


def usage_of(tail: bytes) -> Cost | None:
    """The tokens a response used, from the last ``usage`` object in the end of its
    body (OpenAI's ``prompt_tokens`` and ``completion_tokens``, Anthropic's
    ``input_tokens`` and ``output_tokens``); ``None`` when it says nothing."""
    start = None
    for match in _USAGE.finditer(tail):
        start = match.end()
    if start is None:
        return None
    counts: dict[bytes, int] = {}
    for name, value in _COUNT.findall(tail, start):
        counts.setdefault(name, int(value))
    prompt = counts.get(b"prompt_tokens", counts.get(b"input_tokens"))
    output = counts.get(b"completion_tokens", counts.get(b"output_tokens"))
    if prompt is None and output is None:
        return None
    return Cost.of(prompt or 0, output or 0)


def _four_chars(text: str) -> int:
    return math.ceil(len(text) / 4)


def estimate_cost(content: bytes, policy: QuotaPolicy, *, path: str = "") -> Cost | None:
    """The cost of a request whose body is ``content``, or ``None`` if it is not one
    the dialects know (then the call's cost stays one request). ``path``, the
    request's URL path, tells an embeddings request (its input alone: no output)."""
    if not content or content[:1] not in (b"{", b" ", b"\n", b"\t", b"\r"):
        return None
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    if not isinstance(body, dict):
        return None
    text = prompt_text(body)
    if text is None:
        return None
    count: Callable[[str], int] = policy.count_tokens or _four_chars
    try:
        prompt = int(count(text))
    except Exception:  # a tokenizer's failure must not fail the call
        prompt = _four_chars(text)
    if path.rstrip("/").endswith("/embeddings"):
        return Cost.of(max(0, prompt), 0)
    output = _output_bound(body)
    return Cost.of(max(0, prompt), policy.default_output_tokens if output is None else output)

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
- embeddings (a path ending ``/embeddings``): ``input``, and no output;
- Gemini's ``generateContent`` and ``streamGenerateContent`` (the Gemini API's
  and Vertex AI's): the text parts of ``contents`` (one content per line, after
  its ``role``) and of ``systemInstruction``; output
  ``generationConfig.maxOutputTokens`` for each of ``candidateCount``
  candidates. The REST API takes each field's snake_case name too
  (``system_instruction``, ``generation_config.max_output_tokens``), and so
  does the reader. Non-text parts (images, files, function calls) count
  nothing here: the usage settles them. A ``contents`` body sent to another
  method (``:countTokens``) generates nothing and costs no tokens.

A request that sets no output bound is charged ``default_output_tokens``.
Its scope (``request_scope``) is the quota it spends where a provider meters
per model: the Azure deployment in the path, else the body's ``model``, else
the model a ``/models/...`` path names (Gemini's).
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
from urllib.parse import unquote

from yieldgate.gate import Cost, QuotaPolicy

__all__ = ["estimate_cost", "model_of", "prompt_text", "request_scope", "usage_of"]

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


def _either(mapping: dict[str, Any], camel: str, snake: str) -> Any:
    """A field of a Gemini body by its JSON name, else by its proto name."""
    value = mapping.get(camel)
    return mapping.get(snake) if value is None else value


def _parts_text(content: Any) -> str:
    """The text parts of a Gemini ``Content`` (its ``parts``), joined."""
    if isinstance(content, str):
        return content
    parts = content.get("parts") if isinstance(content, dict) else None
    return _text_of(parts) if isinstance(parts, list) else ""


def _gemini_prompt(contents: list[Any], body: dict[str, Any]) -> str:
    lines = []
    for content in contents:
        if isinstance(content, dict):
            role, text = content.get("role"), _parts_text(content)
            lines.append(f"{role}: {text}" if isinstance(role, str) and role else text)
    system = _parts_text(_either(body, "systemInstruction", "system_instruction"))
    if system:
        lines.insert(0, f"system: {system}")
    return "\n".join(lines)


def prompt_text(body: dict[str, Any]) -> str | None:
    """The prompt of a request body as the provider counts it, or ``None``."""
    contents = body.get("contents")
    if isinstance(contents, list):
        return _gemini_prompt(contents, body)
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
        return f"system: {instructions}\n{text}" if isinstance(instructions, str) else text
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


def _count(value: Any) -> int | None:
    """A count of a Gemini body: an int32 in proto JSON is a number or a string of one."""
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 12:
        return int(value)
    return None


def _gemini_output(body: dict[str, Any], default: int) -> int:
    """The output a Gemini request may produce: ``maxOutputTokens`` (else ``default``)
    for each candidate it asks for."""
    config = _either(body, "generationConfig", "generation_config")
    if not isinstance(config, dict):
        return default
    bound = _count(_either(config, "maxOutputTokens", "max_output_tokens"))
    candidates = _count(_either(config, "candidateCount", "candidate_count"))
    # An unset (or zero) candidateCount is one candidate.
    return (default if bound is None else bound) * (candidates or 1)


# Gemini's methods that generate; another (``:countTokens``, ``:computeTokens``)
# reads ``contents`` and spends no token quota.
_GEMINI_GENERATE = frozenset({"generateContent", "streamGenerateContent"})
_METHOD = re.compile(r":([A-Za-z]+)$")


def _generates(path: str) -> bool:
    method = _METHOD.search(path)
    return method is None or method.group(1) in _GEMINI_GENERATE


_USAGE = re.compile(rb'"(usage|usageMetadata)"\s*:\s*\{')
_COUNT = re.compile(
    rb'"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*([0-9]{1,12})'
)
_GEMINI_COUNT = re.compile(
    rb'"(promptTokenCount|toolUsePromptTokenCount|candidatesTokenCount|thoughtsTokenCount'
    rb'|totalTokenCount)"\s*:\s*([0-9]{1,12})(?![0-9])'
)


def _gemini_usage(tail: bytes, start: int) -> Cost | None:
    """Gemini's ``usageMetadata``: the prompt (with what tools added to it) is the
    input; the candidates and the thoughts, which Gemini counts apart, the output."""
    counts: dict[bytes, int] = {}
    for name, value in _GEMINI_COUNT.findall(tail, start):
        counts.setdefault(name, int(value))
    if not counts.keys() & {b"promptTokenCount", b"candidatesTokenCount", b"totalTokenCount"}:
        return None
    prompt = counts.get(b"promptTokenCount", 0) + counts.get(b"toolUsePromptTokenCount", 0)
    output = counts.get(b"candidatesTokenCount", 0) + counts.get(b"thoughtsTokenCount", 0)
    total = counts.get(b"totalTokenCount")
    if total is not None:
        # The total counts every kind (and one a later model adds): the rest is output.
        output = max(output, total - prompt)
    return Cost.of(prompt, output)


def usage_of(tail: bytes) -> Cost | None:
    """The tokens a response used, from the last ``usage`` object in the end of its
    body (OpenAI's ``prompt_tokens`` and ``completion_tokens``, Anthropic's
    ``input_tokens`` and ``output_tokens``) or Gemini's last ``usageMetadata``
    (a stream's last chunk has the final counts); ``None`` when it says nothing."""
    last: re.Match[bytes] | None = None
    for match in _USAGE.finditer(tail):
        last = match
    if last is None:
        return None
    start = last.end()
    if last.group(1) == b"usageMetadata":
        return _gemini_usage(tail, start)
    counts: dict[bytes, int] = {}
    for name, value in _COUNT.findall(tail, start):
        counts.setdefault(name, int(value))
    prompt = counts.get(b"prompt_tokens", counts.get(b"input_tokens"))
    output = counts.get(b"completion_tokens", counts.get(b"output_tokens"))
    if prompt is None and output is None:
        return None
    return Cost.of(prompt or 0, output or 0)


_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,256})"')
_MODEL_HEAD = 4096  # bytes of an answer's start searched for its ``model``


def model_of(head: bytes) -> str | None:
    """The model an answer names in its first bytes (a JSON body's or a stream's first
    event's ``model``), or ``None``."""
    match = _MODEL.search(head, 0, _MODEL_HEAD)
    return None if match is None else match.group(1).decode("utf-8", "replace")


def _four_chars(text: str) -> int:
    return math.ceil(len(text) / 4)


# A scope longer than this is no model a provider serves: the upstream's own quota.
MAX_SCOPE_CHARS = 256
_DEPLOYMENT = re.compile(r"/openai/deployments/([^/]+)/")
# HF's serverless routes name the model in the path: ``/models/{org}/{name}``, maybe
# followed by ``/v1/...`` or ``/pipeline/...``; Gemini's by ``:generateContent``.
_MODEL_PATH = re.compile(r"/models/([^/:]+(?:/(?!v1/|v1$|pipeline/)[^/:]+)?)")


def request_scope(body: Any, path: str = "") -> str:
    """The quota scope a request spends, as providers meter it: the Azure deployment
    its path names, else the ``model`` its body names, else the model in a
    ``/models/...`` path; ``""`` when it names none."""
    found = _DEPLOYMENT.search(path)
    if found is not None:
        scope = unquote(found.group(1))
    elif isinstance(body, dict) and isinstance(body.get("model"), str):
        scope = body["model"]
    elif (found := _MODEL_PATH.search(path)) is not None:
        scope = unquote(found.group(1))
    else:
        return ""
    return scope if len(scope) <= MAX_SCOPE_CHARS else ""


def _body(content: bytes) -> dict[str, Any] | None:
    if not content or content[:1] not in (b"{", b" ", b"\n", b"\t", b"\r"):
        return None
    try:
        body = json.loads(content)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        return None
    return body if isinstance(body, dict) else None


def estimate_cost(content: bytes, policy: QuotaPolicy, *, path: str = "") -> Cost | None:
    """The cost of a request whose body is ``content``, or ``None`` if it is not one
    the dialects know and names no scope (then the call's cost stays one request).
    ``path``, the request's URL path, tells an embeddings request (its input alone:
    no output), an Azure deployment, a Gemini model and the Gemini method (only
    ``:generateContent`` and ``:streamGenerateContent`` generate). With
    ``policy.per_model`` the cost's scope is the model or deployment the request
    names (``request_scope``)."""
    body = _body(content)
    scope = request_scope(body, path) if policy.per_model else ""
    if body is None:
        return Cost(scope=scope) if scope else None
    text = prompt_text(body)
    gemini = isinstance(body.get("contents"), list)
    if text is None or (gemini and not _generates(path)):
        return Cost(scope=scope) if scope else None
    count: Callable[[str], int] = policy.count_tokens or _four_chars
    try:
        prompt = int(count(text))
    except Exception:  # a tokenizer's failure must not fail the call
        prompt = _four_chars(text)
    if path.rstrip("/").endswith("/embeddings"):
        return Cost.of(max(0, prompt), 0, scope)
    if gemini:
        bound = _gemini_output(body, policy.default_output_tokens)
    else:
        output = _output_bound(body)
        bound = policy.default_output_tokens if output is None else output
    return Cost.of(max(0, prompt), bound, scope)

"""More of OpenAI's routes: the Responses API and Azure OpenAI's deployments.

``Responses`` is ``POST /v1/responses``: ``input`` (a string, or an array of
messages, each ``role`` and ``content`` as a string or ``input_text`` parts,
and bare ``input_text`` parts), ``instructions`` and ``max_output_tokens``;
the answer is a ``response`` object whose ``output`` holds one assistant
message of one ``output_text`` part, with ``usage`` in ``input_tokens`` and
``output_tokens``. A ``max_output_tokens`` that ended the generation makes
it ``incomplete``, as OpenAI's does. Streaming (``stream: true``) is refused
with a 400 naming it: its events are not served here.

``AzureChatCompletions`` is ``POST /openai/deployments/{deployment}/chat/completions``
(the ``api-version`` query is accepted and not checked): the deployment in
the path is the model, whatever the body names, as Azure routes it.
"""

from __future__ import annotations

import uuid
from typing import Any

from yieldgate.server._http_dialect_base import BadRequest, Generated, Job, bool_field, int_field
from yieldgate.server._http_openai import ChatCompletions, _OpenAI

__all__ = ["AzureChatCompletions", "Responses"]


def _part_text(where: str, part: Any) -> str:
    if (
        not isinstance(part, dict)
        or part.get("type") not in ("input_text", "output_text", "text")
        or not isinstance(part.get("text"), str)
    ):
        raise BadRequest(
            f"'{where}' must be a text part "
            '({"type": "input_text", "text": ...}); only text is supported'
        )
    text: str = part["text"]
    return text


def _input_line(i: int, item: Any) -> str:
    where = f"input[{i}]"
    if not isinstance(item, dict):
        raise BadRequest(f"'{where}' must be an object")
    if "content" not in item:
        return _part_text(where, item)
    role = item.get("role")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"'{where}.role' must be a non-empty string")
    content = item["content"]
    if isinstance(content, str):
        return f"{role}: {content}"
    if not isinstance(content, list):
        raise BadRequest(f"'{where}.content' must be a string or an array of parts")
    texts = [_part_text(f"{where}.content[{j}]", part) for j, part in enumerate(content)]
    return f"{role}: {''.join(texts)}"


class Responses(_OpenAI):
    """``POST /v1/responses``."""

    id_prefix = "resp_"
    chunk_object = "response"

    def _logprobs(self, body: dict[str, Any]) -> int | None:
        return None

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        if bool_field(body, "stream"):
            raise BadRequest("streaming is not supported on /v1/responses by this server", "stream")
        given = body.get("input")
        if isinstance(given, str):
            text = given
        elif isinstance(given, list) and given:
            text = "\n".join(_input_line(i, item) for i, item in enumerate(given))
        else:
            raise BadRequest("'input' must be a string or a non-empty array", "input")
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise BadRequest("'instructions' must be a string", "instructions")
        prompt = f"system: {instructions}\n{text}" if instructions else text
        # The fields the chat route reads, under the names it reads them by.
        fields = {k: v for k, v in body.items() if k not in ("input", "instructions")}
        fields.pop("max_tokens", None)
        fields.pop("max_completion_tokens", None)
        output = int_field(body, "max_output_tokens")
        fields.pop("max_output_tokens", None)
        if output is not None:
            fields["max_tokens"] = output
        return self._job(fields, prompt, default_model)

    def ok(self, job: Job, done: Generated) -> Any:
        usage = done.usage or {}
        prompt = int(usage.get("prompt_tokens", 0))
        completion = int(usage.get("completion_tokens", 0))
        cut = done.finish_reason == "length"
        message = {
            "type": "message",
            "id": f"msg_{uuid.uuid4().hex[:24]}",
            "status": "incomplete" if cut else "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": done.text, "annotations": []}],
        }
        return {
            "id": job.id,
            "object": "response",
            "created_at": job.created,
            "status": "incomplete" if cut else "completed",
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "model": job.model,
            "output": [message],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": prompt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            },
        }


class AzureChatCompletions(ChatCompletions):
    """``POST /openai/deployments/{deployment}/chat/completions``."""

    def parse(self, body: dict[str, Any], model_id: str | None, default_model: str) -> Job:
        job = super().parse(body, model_id, default_model)
        if model_id:
            job.model = model_id
        return job

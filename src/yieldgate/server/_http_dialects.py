"""What each HTTP dialect reads and writes: request parsing and response bodies.

Pure functions of JSON values (no I/O, no starlette), one class per route
family: ``ChatCompletions`` and ``Completions`` (OpenAI),
``AnthropicMessages`` (Anthropic's ``/v1/messages``), ``HfModels``
(HuggingFace Inference API), ``TgiGenerate`` (``/generate``,
``/generate_stream`` and TGI's ``POST /``). Each family has its own error and
yield shape; every yield body also carries the governed protocol's fields
(``status``, ``retry_hint_ms``, ``inflight``, ``max_inflight``, ``reason``).

The shared pieces are ``_http_dialect_base``; the OpenAI routes are
``_http_openai``, Anthropic's ``_http_anthropic``, the TGI and HuggingFace
routes ``_http_tgi``. The app
(``_http_app``) imports them all from here.
"""

from yieldgate.server._http_anthropic import AnthropicMessages
from yieldgate.server._http_dialect_base import (
    BadRequest,
    Dialect,
    Generated,
    Job,
    chunk_is_last,
    chunk_text,
    chunk_token_ids,
    dumps,
    generated,
    loads,
    retry_after_s,
    sse,
)
from yieldgate.server._http_openai import ChatCompletions, Completions
from yieldgate.server._http_tgi import HfModels, TgiGenerate

__all__ = [
    "AnthropicMessages",
    "BadRequest",
    "ChatCompletions",
    "Completions",
    "Dialect",
    "Generated",
    "HfModels",
    "Job",
    "TgiGenerate",
    "chunk_is_last",
    "chunk_text",
    "chunk_token_ids",
    "dumps",
    "generated",
    "loads",
    "retry_after_s",
    "sse",
]

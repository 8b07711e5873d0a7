"""Dialects: what a reply of one API family means, as an ``Outcome``.

``get_dialect("openai")`` (or ``anthropic``, ``gemini``, ``huggingface``,
``tgi``, ``governed-http``) gives an ``HttpDialect``; the HTTP transport
applies it to every response, and it doubles as a Gate classifier for plain
httpx calls. The governed TCP
protocol's replies are classified by ``yieldgate.transports.GovernedClient``
itself. ``huggingface_text`` pulls the generated text out of whatever shape a
HuggingFace model answered, and raises ``ResponseFormatError`` for a body it
cannot read.
"""

from yieldgate._exceptions import ResponseFormatError
from yieldgate.dialects._hints import retry_hint_s, should_retry
from yieldgate.dialects._http import (
    ANTHROPIC,
    DIALECTS,
    GEMINI,
    GOVERNED_HTTP,
    HUGGINGFACE,
    OPENAI,
    TGI,
    HttpDialect,
    ResponseLike,
    get_dialect,
)
from yieldgate.dialects._text import huggingface_text

__all__ = [
    "ANTHROPIC",
    "DIALECTS",
    "GEMINI",
    "GOVERNED_HTTP",
    "HUGGINGFACE",
    "OPENAI",
    "TGI",
    "HttpDialect",
    "ResponseFormatError",
    "ResponseLike",
    "get_dialect",
    "huggingface_text",
    "retry_hint_s",
    "should_retry",
]

"""``QuotaConfig``: the provider quota the HTTP front emulates, and what it meters.

A module of its own, below ``quota`` (the buckets) and ``_http_config`` (which
holds one): the configuration is read by the CLI and the config of the front,
the buckets only by the front that serves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["QuotaConfig", "QuotaHeaders", "QuotaResource"]

QuotaResource = Literal["requests", "tokens", "input_tokens", "output_tokens"]
QuotaHeaders = Literal["openai", "azure"]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuotaConfig:
    """The quota to emulate: ``rpm`` requests and ``tpm`` tokens per ``window_s`` seconds.

    Either limit may be left out (``None``: that resource is not limited and
    its headers are not sent), not all. ``itpm`` and ``otpm`` are Anthropic's
    input and output tokens per window, metered on the Messages route only
    (which has buckets of its own: ``rpm`` requests, and ``tpm`` tokens of
    both kinds where it is set). ``default_max_tokens`` is what a
    request that names no ``max_tokens`` costs for its output (16: the
    legacy completions API's default). ``organization`` appears in the 429
    messages, as OpenAI names the account whose limit was reached.

    ``per_model`` gives each model its own buckets of ``rpm`` and ``tpm``;
    ``models`` names limits of its own for some (``{"gpt-4o": (500, 30000)}``,
    either ``None`` for none) and implies ``per_model``. ``headers`` is the
    header style: ``"openai"`` or ``"azure"`` (what remains, alone).
    """

    rpm: int | None = None
    """Requests per window; ``None``: not limited, and no requests headers."""
    tpm: int | None = None
    """Tokens per window (prompt plus output bound); ``None``: not limited."""
    itpm: int | None = None
    """Input tokens per window on the Messages route (Anthropic's ITPM); ``None``: not limited."""
    otpm: int | None = None
    """Output tokens per window on the Messages route (Anthropic's OTPM): ``max_tokens`` at
    the door, the unused part given back when the answer ends; ``None``: not limited."""
    window_s: float = 60.0
    """The window the limits are for, in seconds (default: 60, a minute)."""
    default_max_tokens: int = 16
    """The output a request naming no ``max_tokens`` is charged (default: 16)."""
    organization: str = "org-yieldgate"
    """The account the 429 messages name, as OpenAI's do."""
    per_model: bool = False
    """Give each model its own buckets of ``rpm`` and ``tpm``."""
    models: Mapping[str, tuple[int | None, int | None]] = field(default_factory=dict, hash=False)
    """Limits of their own for some models, ``{model: (rpm, tpm)}``; implies ``per_model``."""
    headers: QuotaHeaders = "openai"
    """The header style: ``"openai"``, or ``"azure"`` (what remains, alone)."""

    def __post_init__(self) -> None:
        names = ("rpm", "tpm", "itpm", "otpm")
        for name in names:
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"quota {name} must be a positive integer, got {value!r}")
        if all(getattr(self, name) is None for name in names) and not self.models:
            raise ValueError("a quota needs rpm, tpm or both (or itpm, otpm, or limits per model)")
        if not (self.window_s > 0 and math.isfinite(self.window_s)):
            raise ValueError(f"quota window_s must be a positive number, got {self.window_s!r}")
        if type(self.default_max_tokens) is not int or self.default_max_tokens < 1:
            raise ValueError("quota default_max_tokens must be a positive integer")
        if not self.organization:
            raise ValueError("quota organization must not be empty")
        if self.headers not in ("openai", "azure"):
            raise ValueError(f"quota headers must be 'openai' or 'azure', got {self.headers!r}")
        for model, limits in self.models.items():
            if not isinstance(model, str) or not model:
                raise ValueError(f"a quota's model must be a non-empty string, got {model!r}")
            if not (isinstance(limits, tuple) and len(limits) == 2):
                raise ValueError(f"quota model {model!r}: limits must be (rpm, tpm)")
            for value in limits:
                if value is not None and (type(value) is not int or value < 1):
                    raise ValueError(
                        f"quota model {model!r}: limits must be positive integers or None, "
                        f"got {limits!r}"
                    )
            if limits == (None, None):
                raise ValueError(f"quota model {model!r} needs rpm, tpm or both")

    @property
    def scoped(self) -> bool:
        """Whether each model has buckets of its own."""
        return self.per_model or bool(self.models)

    def limit(self, resource: QuotaResource, model: str = "") -> int | None:
        """The limit of ``resource`` (``"requests"``, ``"tokens"``, ``"input_tokens"``,
        ``"output_tokens"``) for ``model``."""
        if resource == "input_tokens":
            return self.itpm
        if resource == "output_tokens":
            return self.otpm
        rpm, tpm = self.models.get(model, (self.rpm, self.tpm))
        return rpm if resource == "requests" else tpm

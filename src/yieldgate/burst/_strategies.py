"""Client strategies: yieldgate, and what people use today.

- ``yieldgate``: a ``Gate`` with the default policy, a preset, or a policy
  file: yields narrow its window and are waited out around the hint, with
  jitter, within a retry budget;
- ``naive``: one attempt; any refusal is a failure;
- ``tenacity``: ``AsyncRetrying`` with exponential backoff and jitter, up to
  10 attempts, blind to the server's hints (the common hand-rolled policy);
- ``openai-default``: the official openai-python policy: 2 retries, a hint of
  up to 120 s slept exactly, else ``min(0.5 * 2**n, 8) * (1 - 0.25 * rand)``.
  Against an ``openai+http://`` target it *is* the official client's own
  retry loop (``max_retries=2``); elsewhere the same rule is applied around
  the request;
- ``anthropic-default``: the official anthropic-sdk-python policy, the same
  backoff and 2 retries, but any ``retry-after`` hint slept exactly, however
  long. Against an ``anthropic+http://`` target it is that client's own loop.

The baselines send through a pass-through Gate (one attempt, no window
limit, no breaker), so the same transport counts every strategy's attempts
and only the retry policy differs.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Literal

import anyio

import yieldgate
from yieldgate.burst._targets import Request, Send, TargetKind, retry_signal

__all__ = [
    "OFFICIAL",
    "STRATEGY_NAMES",
    "Strategy",
    "StrategyName",
    "compared_names",
    "load_policy",
]

StrategyName = Literal["yieldgate", "naive", "tenacity", "openai-default", "anthropic-default"]
STRATEGY_NAMES: tuple[StrategyName, ...] = (
    "yieldgate",
    "naive",
    "tenacity",
    "openai-default",
    "anthropic-default",
)
"""The client strategies a burst can compare: a Gate, and what people use today."""


def compared_names(target_kind: str) -> tuple[StrategyName, ...]:
    """What ``--compare`` and the presets run against a target of ``target_kind``: every
    strategy, but ``anthropic-default`` only where it is its own client's loop (an
    ``anthropic+http://`` target)."""
    if target_kind == "anthropic":
        return STRATEGY_NAMES
    return tuple(name for name in STRATEGY_NAMES if name != "anthropic-default")


_PRESETS: dict[str, Callable[..., yieldgate.GatePolicy]] = {
    "default": yieldgate.GatePolicy,
    "cold_start": yieldgate.GatePolicy.cold_start,
    "interactive": yieldgate.GatePolicy.interactive,
    "batch": yieldgate.GatePolicy.batch,
}
_SECTIONS: dict[str, Any] = {
    "window": yieldgate.WindowPolicy,
    "retry": yieldgate.RetryPolicy,
    "budget": yieldgate.RetryBudgetPolicy,
    "breaker": yieldgate.BreakerPolicy,
    "timeout": yieldgate.TimeoutPolicy,
    "rate": yieldgate.RatePolicy,
}
#: ``openai-python``'s constants (``_constants.py``).
OPENAI_MAX_RETRIES = 2
OPENAI_MAX_RETRY_AFTER_S = 120.0
#: ``anthropic-sdk-python``'s: the same retries and backoff; a hint is slept whatever
#: its length (capped only below the platform's sleep limit).
ANTHROPIC_MAX_RETRIES = 2
ANTHROPIC_MAX_RETRY_AFTER_S = 4_294_967.0
#: The official clients' policies: the target kind whose client runs the policy
#: itself, its ``max_retries``, and the longest hint it sleeps exactly.
OFFICIAL: dict[str, tuple[TargetKind, int, float]] = {
    "openai-default": ("openai", OPENAI_MAX_RETRIES, OPENAI_MAX_RETRY_AFTER_S),
    "anthropic-default": ("anthropic", ANTHROPIC_MAX_RETRIES, ANTHROPIC_MAX_RETRY_AFTER_S),
}
TENACITY_ATTEMPTS = 10


def tenacity_wait() -> Any:
    """The tenacity strategy's wait: exponential from 50 ms, capped at 5 s, jittered.

    tenacity 9.2 renamed ``wait_exponential_jitter``'s ``initial`` to
    ``multiplier`` (the old name warns); 9.0 and 9.1 know only ``initial``,
    and google-genai pins tenacity below 9.2, so both are met in the field.
    """
    import inspect

    from tenacity import wait_exponential_jitter

    name = (
        "multiplier"
        if "multiplier" in inspect.signature(wait_exponential_jitter).parameters
        else "initial"
    )
    return wait_exponential_jitter(max=5, **{name: 0.05})


def load_policy(spec: str) -> tuple[yieldgate.GatePolicy, str]:
    """A Gate policy and its label from a preset name or a JSON file.

    The file holds ``{"preset": "cold_start", "preset_args": {...}, "window":
    {...}, "retry": {...}, ...}``: a preset (default ``default``) and, per
    section of ``GatePolicy``, the fields to change (``"rate": null`` removes
    a rate cap). Unknown keys are errors.
    """
    name = spec.strip().replace("-", "_")
    if name in _PRESETS:
        return _PRESETS[name](), name
    path = Path(spec)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(
            f"policy {spec!r} is neither a preset ({', '.join(_PRESETS)}) nor a readable file: "
            f"{exc.strerror}"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"policy file {spec}: not JSON ({exc})") from None
    if not isinstance(document, Mapping):
        raise ValueError(f"policy file {spec}: expected a JSON object")  # noqa: TRY004 - bad input
    return _policy_from(document, spec), path.stem


def _policy_from(document: Mapping[str, Any], where: str) -> yieldgate.GatePolicy:
    unknown = set(document) - {"preset", "preset_args", *_SECTIONS}
    if unknown:
        raise ValueError(f"policy file {where}: unknown keys {sorted(unknown)}")
    preset = str(document.get("preset", "default")).replace("-", "_")
    if preset not in _PRESETS:
        raise ValueError(f"policy file {where}: unknown preset {preset!r}")
    try:
        policy = _PRESETS[preset](**document.get("preset_args", {}))
        changes = {
            section: _section(getattr(policy, section), cls, section, document[section])
            for section, cls in _SECTIONS.items()
            if section in document
        }
        return replace(policy, **changes)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"policy file {where}: {exc}") from None


def _section(current: Any, cls: Any, name: str, values: Any) -> Any:
    if values is None:
        return None
    if not isinstance(values, Mapping):
        raise ValueError(f"{name} must be an object or null")  # noqa: TRY004 - bad input
    if current is None:
        return cls(**values)
    unknown = set(values) - {f.name for f in fields(current)}
    if unknown:
        raise ValueError(f"{name}: unknown fields {sorted(unknown)}")
    return replace(current, **values)


def _pass_through_gate(instrumentation: Any = None) -> yieldgate.Gate:
    """One attempt, no waiting, no limit, no breaker, no quota pacing: a transport that
    only counts. (A Gate learns a provider's quota from its headers by default and
    would hold the baselines' attempts until the quota had room, which no baseline's
    client does.)"""
    return yieldgate.Gate(
        yieldgate.GatePolicy(
            retry=yieldgate.RetryPolicy.no_retry(),
            window=yieldgate.WindowPolicy.fixed(1_000_000),
            breaker=yieldgate.BreakerPolicy.disabled(),
            quota=yieldgate.QuotaPolicy(learn=False),
        ),
        name="pass-through",
        instrumentation=instrumentation,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Strategy:
    """One way of sending a burst."""

    name: StrategyName
    policy: yieldgate.GatePolicy | None = None
    policy_label: str | None = None

    def __post_init__(self) -> None:
        if self.name not in STRATEGY_NAMES:
            raise ValueError(f"unknown strategy {self.name!r}: use {', '.join(STRATEGY_NAMES)}")
        if self.policy is not None and self.name != "yieldgate":
            raise ValueError("only the yieldgate strategy takes a policy")

    @classmethod
    def parse(cls, name: str, *, policy: str | None = None) -> Strategy:
        if name != "yieldgate" or policy is None:
            return cls(name=name)  # type: ignore[arg-type]
        loaded, label = load_policy(policy)
        return cls(name="yieldgate", policy=loaded, policy_label=label)

    @property
    def label(self) -> str:
        if self.name == "yieldgate" and self.policy_label not in (None, "default"):
            return f"yieldgate ({self.policy_label})"
        return self.name

    def make_gate(self, instrumentation: Any = None) -> yieldgate.Gate:
        """This strategy's Gate; ``instrumentation`` hears its attempts (the attempt log)."""
        if self.name == "yieldgate":
            return yieldgate.Gate(
                self.policy or yieldgate.GatePolicy(),
                name="burst",
                instrumentation=instrumentation,
            )
        return _pass_through_gate(instrumentation)

    def native_retries(self, kind: TargetKind) -> int:
        """The official client's ``max_retries`` for this strategy on ``kind``: 2 for
        ``openai-default`` on ``openai+http://`` and ``anthropic-default`` on
        ``anthropic+http://`` (the client's own loop), else 0."""
        official = OFFICIAL.get(self.name)
        return official[1] if official is not None and official[0] == kind else 0

    def wrap(self, send: Send, kind: TargetKind, *, seed: int) -> Send:
        """``send`` with this strategy's retries around it (when the client has none)."""
        if self.name in ("yieldgate", "naive"):
            return send
        if self.name == "tenacity":
            return _tenacity(send)
        client_kind, retries, longest_hint = OFFICIAL[self.name]
        if kind == client_kind:
            return send  # the official client retries by itself
        return _official_rule(send, random.Random(seed), retries, longest_hint)  # noqa: S311


def _tenacity(send: Send) -> Send:
    from tenacity import (
        AsyncRetrying,
        retry_if_exception,
        stop_after_attempt,
    )

    retrying = AsyncRetrying(
        stop=stop_after_attempt(TENACITY_ATTEMPTS),
        wait=tenacity_wait(),
        retry=retry_if_exception(lambda exc: retry_signal(exc)[0]),
        reraise=True,
    )

    async def call(prompt: str, request: Request) -> None:
        await retrying(send, prompt, request)

    return call


def _official_rule(send: Send, rng: random.Random, retries: int, longest_hint: float) -> Send:
    """The official clients' loop (openai's and anthropic's are one design) around ``send``."""

    async def call(prompt: str, request: Request) -> None:
        for n in range(retries + 1):
            try:
                await send(prompt, request)
            except Exception as exc:
                retryable, hint = retry_signal(exc)
                if not retryable or n == retries:
                    raise
                if hint is not None and 0 < hint <= longest_hint:
                    await anyio.sleep(hint)  # exactly: every client wakes together
                else:
                    await anyio.sleep(min(0.5 * 2**n, 8.0) * (1 - 0.25 * rng.random()))
            else:
                return

    return call

"""One request inside the engine: its tokens, its KV blocks and its sampling."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from yieldgate.protocol import Priority

__all__ = [
    "MAX_TOP_LOGPROBS",
    "SamplingParams",
    "Sequence",
    "SequenceStatus",
    "TokenLogprob",
    "rank_of",
]

# The most alternatives a token's log-probability comes with (OpenAI's limit).
MAX_TOP_LOGPROBS = 20

# The order the engine serves priorities in: the lower rank first.
_RANK = {Priority.HIGH: 0, Priority.NORMAL: 1, Priority.LOW: 2}


def rank_of(priority: Priority) -> int:
    """0 for high priority, 1 for normal, 2 for low: the order the engine serves them in."""
    return _RANK[priority]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to pick tokens: ``temperature`` 0 is greedy; ``seed`` makes sampling repeat.

    ``top_p`` below 1 samples from the nucleus: the most likely tokens whose
    probabilities (after temperature) add up to at least ``top_p`` (greedy
    ignores it). ``logprobs`` asks for each new token's log-probability and
    that many most likely alternatives (``0`` to ``MAX_TOP_LOGPROBS``);
    ``None``, the default, computes none.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    top_p: float = 1.0
    logprobs: int | None = None

    def __post_init__(self) -> None:
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ValueError("max_tokens must be an integer >= 1")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError("temperature must be a finite number >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be a number in (0, 1]")
        if self.logprobs is not None and (
            type(self.logprobs) is not int or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS
        ):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}]")


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's log-probability and its ``top`` alternatives, ``(token, logprob)``
    from the most likely down.

    The distribution is the one the token was drawn from: the model's
    logits divided by the temperature (by 1 for greedy), before ``top_p``
    cut it (a cut-off token would have no finite log-probability).
    """

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # no blocks yet
    REMOTE = "remote"  # holds blocks; a prefill worker is computing their KV
    READY = "ready"  # holds blocks with KV up to num_computed; the rest prefills locally
    RUNNING = "running"
    SWAPPED = "swapped"  # KV paged out to the host tier (or on its way back)
    FINISHED = "finished"


class Sequence:
    """A prompt and what has been generated for it so far.

    ``num_computed`` counts the tokens whose keys and values are in the
    cache; ``num_cached`` how many of those came from the prefix cache at the
    last admission. After a preemption the sequence is prefilled again over
    its prompt and its output so far (recompute), so the counters restart.

    ``priority`` is the request's; the scheduler serves a lower ``rank``
    first and preempts a higher one first. ``arrival_step`` is the
    scheduler's step count when the sequence arrived (its age bound counts
    from there).
    """

    __slots__ = (
        "arrival_step",
        "block_table",
        "id",
        "last_hash",
        "logprobs",
        "num_cached",
        "num_committed",
        "num_computed",
        "num_preemptions",
        "num_prompt",
        "params",
        "prefill_tokens",
        "prefix_hit_tokens",
        "priority",
        "status",
        "tokens",
    )

    def __init__(
        self,
        seq_id: int,
        prompt: list[int],
        params: SamplingParams,
        priority: Priority = Priority.NORMAL,
    ) -> None:
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        if not isinstance(priority, Priority):
            raise TypeError(f"priority must be a Priority, got {priority!r}")
        self.id = seq_id
        self.priority = priority
        self.arrival_step = 0
        self.tokens = list(prompt)
        self.num_prompt = len(prompt)
        self.params = params
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_computed = 0
        self.num_cached = 0
        # Prefix-cache bookkeeping (the block manager's): blocks registered so far
        # and the hash of the last one, which the next block's hash chains from.
        self.num_committed = 0
        self.last_hash = -1
        self.num_preemptions = 0
        # Totals over the sequence's life, preemptions included.
        self.prefix_hit_tokens = 0
        self.prefill_tokens = 0
        # One per output token, when the params ask for them.
        self.logprobs: list[TokenLogprob] = []

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Sequence(id={self.id}, len={len(self.tokens)}, status={self.status.value})"

    @property
    def rank(self) -> int:
        """0 for high priority, 1 for normal, 2 for low: the order the engine serves them in."""
        return _RANK[self.priority]

    @property
    def num_output(self) -> int:
        return len(self.tokens) - self.num_prompt

    @property
    def output(self) -> list[int]:
        return self.tokens[self.num_prompt :]

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    @property
    def is_done(self) -> bool:
        """Whether it has generated everything it asked for."""
        return self.num_output >= self.params.max_tokens

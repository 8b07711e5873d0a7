"""One request inside the engine: its tokens, its KV blocks and its sampling."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

__all__ = ["SamplingParams", "Sequence", "SequenceStatus"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to pick tokens: ``temperature`` 0 is greedy; ``seed`` makes sampling repeat."""

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if type(self.max_tokens) is not int or self.max_tokens < 1:
            raise ValueError("max_tokens must be an integer >= 1")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise ValueError("temperature must be a finite number >= 0")


class SequenceStatus(enum.Enum):
    WAITING = "waiting"  # no blocks yet
    REMOTE = "remote"  # holds blocks; a prefill worker is computing their KV
    READY = "ready"  # holds blocks with KV up to num_computed; the rest prefills locally
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """A prompt and what has been generated for it so far.

    ``num_computed`` counts the tokens whose keys and values are in the
    cache; ``num_cached`` how many of those came from the prefix cache at the
    last admission. After a preemption the sequence is prefilled again over
    its prompt and its output so far (recompute), so the counters restart.
    """

    __slots__ = (
        "block_table",
        "id",
        "last_hash",
        "num_cached",
        "num_committed",
        "num_computed",
        "num_preemptions",
        "num_prompt",
        "params",
        "prefill_tokens",
        "prefix_hit_tokens",
        "status",
        "tokens",
    )

    def __init__(self, seq_id: int, prompt: list[int], params: SamplingParams) -> None:
        if not prompt:
            raise ValueError("a prompt needs at least one token")
        self.id = seq_id
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

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"Sequence(id={self.id}, len={len(self.tokens)}, status={self.status.value})"

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

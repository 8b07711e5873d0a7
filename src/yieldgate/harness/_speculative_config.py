"""``SpeculativeConfig``: the options of speculative decoding.

A module of its own, below the two parts that read it: the draft, which
distills its exit head by it (``_draft_model``), and the ``Speculator`` that
drafts and verifies (``speculative``, which re-exports it).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SpeculativeConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding options (``EngineConfig.speculative``; ``None`` turns it off).

    ``draft_layers``: how many of the target's first layers the draft runs
    (fewer than the target has; 0 leaves the embeddings and the exit head, a
    bigram table in effect). ``k``: tokens drafted per step.
    ``branch_threshold``: a draft position whose top-1 probability is below
    it gets a second branch (its second choice) verified in the same step;
    0 never branches. ``max_extra_tokens``: the most branch tokens verified
    in one step, over the whole batch. ``distill_steps``: optimiser steps
    fitting the draft's exit head to the target's output on
    ``distill_sequences`` greedy continuations of ``distill_tokens`` tokens
    (0 keeps the target's own head); ``distill_seed`` draws their prompts.
    """

    draft_layers: int = 1
    k: int = 4
    branch_threshold: float = 0.0
    max_extra_tokens: int = 4
    distill_steps: int = 200
    distill_sequences: int = 64
    distill_tokens: int = 64
    distill_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("k", "distill_sequences", "distill_tokens"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} must be an integer >= 1")
        for name in ("draft_layers", "max_extra_tokens", "distill_steps", "distill_seed"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be an integer >= 0")
        if self.k > 32:
            raise ValueError("k must be <= 32")
        if not 0.0 <= self.branch_threshold <= 1.0:
            raise ValueError("branch_threshold must be in [0, 1]")

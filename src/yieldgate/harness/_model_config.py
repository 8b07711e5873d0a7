"""``ModelConfig``: the shape of the harness's transformer.

A module of its own, below both the model (``model``) and its KV cache
(``_kv_cache``), which is sized by it: the model holds a cache, and the cache
must not import the model back.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ModelConfig"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """Shape of the model. The defaults are the harness's tiny GPT (about 3.3M weights)."""

    vocab_size: int = 256
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    max_seq_len: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError("d_model must be a multiple of n_heads")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

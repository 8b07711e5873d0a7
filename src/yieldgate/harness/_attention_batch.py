"""``AttentionBatch``: what a forward pass over the paged KV cache writes and attends to.

Built by the model runner (and speculative decoding), read by the model's
attention (``model``). Apart from the model because it is the runner's and
the model's shared vocabulary, not a layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from yieldgate.harness._resident import ResidentStep

__all__ = ["AttentionBatch"]


@dataclass(slots=True, kw_only=True)
class AttentionBatch:
    """Where the new tokens' keys go and what each query attends to.

    ``slot_mapping[i]`` is the cache slot of new token ``i``. For a prefill
    batch, sequence ``j`` owns new tokens ``query_starts[j]`` to
    ``query_starts[j + 1]``, and attends over ``context_slots[j]`` (every
    slot of its context, cached prefix first), of which the first
    ``num_cached[j]`` were in the cache before this step. For a decode batch
    every sequence has one new token and attends over the row
    ``context_slots[j]`` of a padded matrix whose ``context_mask`` is true
    where a slot is real.

    A decode batch may give its context by block instead (``context_blocks``,
    ``(rows, blocks)``, padded with any block): row ``j``'s context is every
    slot of its blocks in order, ``block_size`` each, and ``context_mask``
    covers that many columns. Gathering whole blocks moves the same bytes as
    gathering slots, in runs of a block (``_gather_context``).

    A decode batch with ``query_index`` set has several new tokens per row
    (speculative verification): new token ``i`` is query ``query_index[i]``
    of the flattened ``(rows, queries)`` grid, and ``context_mask`` has a
    row per query, ``(rows, 1, queries, context)``.

    ``num_stepwise[j]`` (prefill): how many of sequence ``j``'s last new
    tokens decode had written one at a time (a recompute's output so far);
    an int8 cache writes and attends them one at a time again, in order.

    ``resident`` (a CPU's decode by block, ``_resident``): the rows that hold
    each sequence's context between steps, attended over in place.
    """

    is_prefill: bool
    slot_mapping: Tensor
    context_slots: list[Tensor] | Tensor | None = None
    context_blocks: Tensor | None = None
    query_starts: list[int] | None = None
    num_cached: list[int] | None = None
    context_mask: Tensor | None = None
    query_index: Tensor | None = None
    num_stepwise: list[int] | None = None
    resident: ResidentStep | None = None

"""``ResidentKV``: each decoding sequence's keys and values, contiguous, kept between steps.

A decode step by block attends over every running sequence's whole context.
Gathered from the paged cache, that context is copied once a step and read
once more by attention: on a CPU the copy costs more than the attention
itself (issue 42). The resident copy keeps each row of the decode batch in
place between steps, so a step writes its new token there too (beside the
paged cache, which stays the truth) and attention reads the rows where they
are, with no gather.

What keeps it right. A row is built from its sequence's blocks, and is kept
while the same sequence decodes from the same blocks with nothing of them
written since but through the decode steps that also write the row. Anything
else that writes a block (a prefill or recompute, speculative decoding's
steps and copies, KV arriving from a prefill worker, a page-in) drops the
rows built from that block (``drop_slots``), and a row whose sequence, block
table or length is not what the step expects is rebuilt from the cache (one
gather, today's cost, once). So its reads are exactly the cache's: outputs are
bit-identical with the gather's.

Storage: ``(n_layers, rows, 2, n_heads, columns, head_dim)`` in the cache's
dtype: a layer's rows together (attention reads them in one call), keys
then values, heads first, as attention reads them (keys and values side by
side per token read 1.5x slower), one write per layer and step, grown by
doubling, zero at first (a masked column must hold a finite
number: a probability of zero times NaN is NaN). It costs a second copy of
the running sequences' KV, which is why a float cache on a CPU uses it and
the others (``EngineConfig.resident_kv``) need not.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ResidentKV", "ResidentStep", "resident_counters"]


@dataclass(slots=True)
class _Row:
    row: int
    blocks: tuple[int, ...]
    length: int  # slots 0..length - 1 hold the cache's values


@dataclass(slots=True, kw_only=True)
class ResidentStep:
    """One decode step's use of the resident rows: the model writes and reads through it."""

    store: Tensor  # (n_layers, rows, 2, H, columns, D), the whole buffer
    rows: int
    columns: int  # what this step attends over: its blocks' slots
    # (n_layers, rows * 2 * H): where each new key's and value's heads go, by
    # (layer, row, key or value, head, column) in the store seen as rows of D.
    write_at: Tensor
    mask: Tensor  # (rows, 1, 1, columns): 0 where a row attends, -inf elsewhere

    def write(self, layer: int, kv: Tensor) -> None:
        """Put the step's new keys and values ``(rows, 2, H, D)`` of ``layer`` in their rows."""
        flat = self.store.view(-1, self.store.shape[-1])
        flat.index_copy_(0, self.write_at[layer], kv.reshape(-1, kv.shape[-1]))

    def keys_values(self, layer: int) -> tuple[Tensor, Tensor]:
        """``layer``'s keys and values of every row, ``(rows, H, columns, D)`` each (views)."""
        held = self.store[layer, : self.rows, :, :, : self.columns]
        return held[:, 0], held[:, 1]


class ResidentKV:
    """The decode batch's rows of keys and values, kept between steps (see the module)."""

    def __init__(self, *, n_layers: int, n_heads: int, head_dim: int, block_size: int,
                 dtype: torch.dtype, device: torch.device, rows: int = 1,
                 columns: int = 256, limit: int | None = None) -> None:  # fmt: skip
        self._shape = (n_layers, n_heads, head_dim)
        self.block_size = block_size
        # What the first step allocates at least: a batch of ``rows`` (the scheduler's
        # max_num_seqs) and contexts of ``columns``, so that growing is rare.
        self._least = (rows, -(-columns // block_size) * block_size)
        # At most this many rows x columns (the paged cache's slots): never more
        # memory than the cache itself. A step that would need more gathers.
        self._limit = limit
        self._dtype, self._device = dtype, device
        self.store: Tensor | None = None
        self._strides: tuple[int, Tensor, Tensor] = (0, torch.empty(0), torch.empty(0))
        self._held: dict[int, _Row] = {}  # sequence id: where its row is and what it holds
        self._pending: list[tuple[int, _Row]] = []
        self.rows_built = 0  # rows built from the cache, for tests and benchmarks
        self.rows_moved = 0
        self.steps_gathered = 0  # steps whose rows would have passed the limit

    def drop_blocks(self, blocks: set[int]) -> None:
        """Forget the rows built from any of ``blocks``: something else wrote them."""
        if self._held and blocks:
            gone = [sid for sid, held in self._held.items() if not blocks.isdisjoint(held.blocks)]
            for sid in gone:
                del self._held[sid]

    def drop_slots(self, slots: Tensor) -> None:
        """``drop_blocks`` for the blocks of cache ``slots``."""
        if self._held and slots.numel():
            self.drop_blocks(set(torch.div(slots, self.block_size, rounding_mode="floor").tolist()))

    def step(
        self,
        cache_blocks: tuple[Tensor, Tensor],
        ids: list[int],
        tables: list[list[int]],
        positions: list[int],
        padded: Tensor,
        mask: Tensor,
    ) -> ResidentStep | None:
        """Ready the rows of one decode step and say how its model uses them.

        Row ``r`` is sequence ``ids[r]``, its new token at ``positions[r]``, its
        context blocks ``padded[r]`` (``(rows, width)`` on the device) and
        ``tables[r]`` (on the host), attending where ``mask`` (bool, ``(rows, 1, 1,
        columns)``) is true. Rows held elsewhere move; rows not held
        (or not as expected) are built from ``cache_blocks`` (each
        ``(n_layers, num_blocks, block_size, H, D)``). ``commit`` after the model
        has run marks them held; until then none is. ``None``: the rows would
        take more memory than the limit; the step gathers instead, and no row
        is held afterwards.
        """
        size = self.block_size
        rows, width = padded.shape
        columns = width * size
        store = self._fit(rows, columns)
        if store is None:
            self._held.clear()
            self._pending = []
            self.steps_gathered += 1
            return None
        sources: list[int] = []
        for sid, table, at in zip(ids, tables, positions, strict=True):
            held = self._held.get(sid)
            kept = (
                held is not None
                and held.length == at
                and held.blocks == tuple(table[: -(-at // size)])
            )
            sources.append(held.row if kept and held is not None else -1)
        self._held.clear()  # held again only at commit: a failed step leaves none
        moved = [(r, s) for r, s in enumerate(sources) if s >= 0 and s != r]
        if moved:
            _move_rows(store, moved, columns)
            self.rows_moved += len(moved)
        stale = [r for r, s in enumerate(sources) if s < 0]
        if stale:
            self._build(store, cache_blocks, padded, stale, columns)
        self._pending = [
            (sid, _Row(r, tuple(table[: at // size + 1]), at + 1))
            for r, (sid, table, at) in enumerate(zip(ids, tables, positions, strict=True))
        ]
        # Flat index of (layer, row, key or value, head, column): a row's first
        # layer's first head at its column, then fixed strides on (``_strides``).
        per_row, heads_at, layers_at = self._strides
        rows_at = [r * per_row + p for r, p in enumerate(positions)]
        firsts = torch.tensor(rows_at, device=self._device).unsqueeze(1)
        write_at = (firsts + heads_at).reshape(-1) + layers_at
        # As attention would make it of the bool mask, once a step instead of once a layer.
        additive = torch.zeros(mask.shape, dtype=self._dtype, device=self._device)
        additive.masked_fill_(~mask, float("-inf"))
        return ResidentStep(
            store=store, rows=rows, columns=columns, write_at=write_at, mask=additive
        )

    def commit(self) -> None:
        """The step's model ran: its rows now hold their sequences' contexts."""
        self._held = dict(self._pending)
        self._pending = []

    def _build(
        self,
        store: Tensor,
        cache_blocks: tuple[Tensor, Tensor],
        padded: Tensor,
        stale: list[int],
        columns: int,
    ) -> None:
        index = torch.tensor(stale, device=self._device)
        flat = padded.index_select(0, index).reshape(-1)
        n_layers = store.shape[0]
        for i, blocks in enumerate(cache_blocks):
            got = blocks.index_select(1, flat)  # (n_layers, stale * width, size, H, D)
            # To (n_layers, stale, H, columns, D), as the rows hold them.
            got = got.view(n_layers, len(stale), columns, *got.shape[3:]).transpose(2, 3)
            if stale == list(range(stale[0], stale[-1] + 1)):
                store[:, stale[0] : stale[-1] + 1, i, :, :columns] = got
            else:
                store[:, index, i, :, :columns] = got
        self.rows_built += len(stale)

    def _fit(self, rows: int, columns: int) -> Tensor | None:
        store = self.store
        if store is not None and store.shape[1] >= rows and store.shape[4] >= columns:
            return store
        old_rows, old_columns = (store.shape[1], store.shape[4]) if store is not None else (0, 0)
        new_rows = max(rows, old_rows, self._least[0])
        new_columns = max(columns, 2 * old_columns, self._least[1])
        if columns <= old_columns:  # only the rows grow
            new_columns = old_columns
        limit = self._limit
        if limit is not None and new_rows * new_columns > limit:
            # Within the limit: fewer spare columns, then no spare rows, else none.
            size = self.block_size
            new_columns = max(columns, limit // new_rows // size * size)
            if new_rows * new_columns > limit:
                new_rows = rows
            if new_rows * new_columns > limit:
                return None
        n_layers, heads, dim = self._shape
        grown = torch.zeros(
            (n_layers, new_rows, 2, heads, new_columns, dim), dtype=self._dtype,
            device=self._device,
        )  # fmt: skip
        if store is not None:
            kept_rows, kept_columns = min(old_rows, new_rows), min(old_columns, new_columns)
            grown[:, :kept_rows, :, :, :kept_columns] = store[:, :kept_rows, :, :, :kept_columns]
            # Rows cut off, or held past the columns kept, are held no more.
            self._held = {
                sid: held
                for sid, held in self._held.items()
                if held.row < kept_rows and held.length <= kept_columns
            }
        self.store = grown
        device = self._device
        self._strides = (
            2 * heads * new_columns,  # a row
            torch.arange(2 * heads, device=device) * new_columns,  # keys' then values' heads
            torch.arange(n_layers, device=device).unsqueeze(1)
            * (new_rows * 2 * heads * new_columns),
        )
        return grown


def _move_rows(store: Tensor, moved: list[tuple[int, int]], columns: int) -> None:
    """Row ``s``'s first ``columns`` columns to row ``r``, for every ``(r, s)`` in ``moved``.

    Row by row, as slices: ``index_select`` and ``index_copy_`` over the
    columns' view (not contiguous once the rows have spare columns) took
    250-350 ms on this CPU whatever the number of rows, for 64 rows of 832
    columns of the default model, and that stalled a decode step each time a
    long sequence left the batch; a slice copies one row's bytes, about a
    millisecond for 3.4 MB. Every source is read before it is overwritten:
    in row order when every row moves up the store (a finished sequence's
    rows closing the gap), through copies otherwise.
    """
    if all(s > r for r, s in moved):
        for r, s in sorted(moved):
            store[:, r, :, :, :columns] = store[:, s, :, :, :columns]
        return
    copies = [(r, store[:, s, :, :, :columns].clone()) for r, s in moved]
    for r, rows in copies:
        store[:, r, :, :, :columns] = rows


def resident_counters(resident: ResidentKV | None) -> dict[str, int]:
    """``Engine.stats``' view of the resident rows: their memory, how often they were
    built from the cache or moved, and the steps that gathered because the rows would
    have passed their limit (zeros when decode gathers instead)."""
    store = None if resident is None else resident.store
    return {
        "kv_resident_bytes": 0 if store is None else store.numel() * store.element_size(),
        "kv_resident_rows_built": 0 if resident is None else resident.rows_built,
        "kv_resident_rows_moved": 0 if resident is None else resident.rows_moved,
        "kv_resident_steps_gathered": 0 if resident is None else resident.steps_gathered,
    }

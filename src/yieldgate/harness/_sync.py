"""Crossings between the host and the device on the decode path, through one door each.

On CUDA every read of a device tensor by the host (``.tolist()``,
``.item()``, ``bool(t)``, ``int(t)``) blocks the host until the stream has
run every kernel queued before it: while it waits, the host queues nothing,
so the GPU idles between steps for as long as the host then takes to prepare
the next one. A decode step therefore reads once, at its end (the sampled
tokens, with their log-probabilities and, when speculating, the drafts),
through ``to_host``; ``count_syncs`` counts those reads for a test, and
``tests/harness/test_syncs.py`` checks that the decode path reads through
nothing else. On the CPU a read costs no wait, but it is counted the same.

The other way, ``to_device`` makes a step's index tensors from Python lists
in one copy, from pinned memory on CUDA so that the copy is queued
(``non_blocking``) rather than waited for.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

__all__ = ["SyncCount", "count_syncs", "to_device", "to_host"]


class SyncCount:
    """How many times the host waited for the device (``to_host`` calls) while counting."""

    def __init__(self) -> None:
        self.reads = 0


_active: SyncCount | None = None


@contextmanager
def count_syncs() -> Iterator[SyncCount]:
    """Count every ``to_host`` call made inside the ``with`` block (tests)."""
    global _active
    previous, _active = _active, SyncCount()
    try:
        yield _active
    finally:
        _active = previous


def to_host(*tensors: Tensor) -> list[Any]:
    """``tensors`` as Python values (``Tensor.tolist``), read with one wait for the device.

    On CUDA each is copied into pinned host memory without waiting, then the
    stream is waited for once, however many tensors there are.
    """
    if _active is not None:
        _active.reads += 1
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    staged: Sequence[Tensor] = tensors
    if devices:
        staged = [t.to("cpu", non_blocking=True) for t in tensors]
        for device in devices:
            torch.cuda.current_stream(device).synchronize()
    return [t.tolist() for t in staged]


def to_device(
    rows: Sequence[Sequence[float]], device: torch.device, dtype: torch.dtype = torch.int64
) -> list[Tensor]:
    """One 1-D tensor per list of ``rows`` on ``device``, made in one host-to-device copy."""
    flat = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=dtype)
    if device.type == "cuda":
        # Pinned, so the copy is queued; the caching host allocator keeps the
        # buffer from reuse until the copy has run.
        flat = flat.pin_memory().to(device, non_blocking=True)
    return list(torch.split(flat, [len(row) for row in rows]))

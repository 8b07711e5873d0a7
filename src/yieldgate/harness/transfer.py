"""Moving KV between processes: the control messages, the transfer header, the checksum.

Control messages are JSON objects, one per ``Connection.send_bytes`` on a
``multiprocessing`` pipe (never pickled). The KV itself goes over
``torch.distributed`` point-to-point on a gloo process group built directly
from a ``TCPStore`` (no global default group), so that one process may hold
several. Each transfer is announced by a ``KvHeader`` (request id, positions,
dtype, shape, checksum); the receiver checks the header against what it
expects before it receives a byte, and the checksum after.

On CUDA the KV is staged through host memory (``.cpu()`` on the producer,
``.to(device)`` on the consumer): gloo moves CPU tensors, NCCL refuses two
ranks on one GPU, and a single-GPU machine is the common case here.
"""

from __future__ import annotations

import datetime
import json
import zlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "DTYPES",
    "KvHeader",
    "TransferError",
    "connect_group",
    "decode_message",
    "encode_message",
    "kv_checksum",
    "tcp_store",
]

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
_STORE_PREFIX = "yieldgate-kv"
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class TransferError(Exception):
    """A control message or KV transfer that is malformed or does not check out."""


def encode_message(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode("utf-8")


def decode_message(raw: bytes) -> dict[str, Any]:
    if len(raw) > _MAX_MESSAGE_BYTES:
        raise TransferError(f"control message of {len(raw)} bytes is too large")
    try:
        message = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TransferError(f"control message is not JSON: {exc}") from None
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise TransferError("control message has no 'op'")
    return message


def kv_checksum(kv: torch.Tensor) -> int:
    """CRC-32 of the tensor's bytes (it must be a contiguous CPU tensor)."""
    if kv.device.type != "cpu" or not kv.is_contiguous():
        raise ValueError("kv_checksum needs a contiguous CPU tensor")
    return zlib.crc32(kv.view(torch.uint8).numpy().data)


@dataclass(frozen=True, slots=True, kw_only=True)
class KvHeader:
    """What precedes each KV transfer: whose KV, which positions, what shape, its checksum.

    ``shape`` is ``(2, n_layers, tokens, n_heads, head_dim)``; the KV covers
    positions ``start`` to ``start + tokens - 1`` of request ``request_id``.
    """

    request_id: int
    start: int
    dtype: str
    shape: tuple[int, ...]
    checksum: int
    compute_ms: float = 0.0

    @property
    def tokens(self) -> int:
        return self.shape[2]

    @property
    def nbytes(self) -> int:
        count = 1
        for dim in self.shape:
            count *= dim
        return count * torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    def to_message(self) -> dict[str, Any]:
        return {
            "op": "kv",
            "id": self.request_id,
            "start": self.start,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "checksum": self.checksum,
            "compute_ms": self.compute_ms,
        }

    @classmethod
    def for_tensor(
        cls, request_id: int, start: int, kv: torch.Tensor, compute_ms: float = 0.0
    ) -> KvHeader:
        return cls(
            request_id=request_id,
            start=start,
            dtype=_NAMES[kv.dtype],
            shape=tuple(kv.shape),
            checksum=kv_checksum(kv),
            compute_ms=compute_ms,
        )

    @classmethod
    def from_message(cls, message: dict[str, Any], *, expect: tuple[int, int, int]) -> KvHeader:
        """Validate a ``kv`` message; ``expect`` is ``(n_layers, n_heads, head_dim)``."""
        try:
            request_id, start = message["id"], message["start"]
            dtype, shape, checksum = message["dtype"], message["shape"], message["checksum"]
            compute_ms = float(message.get("compute_ms", 0.0))
        except (KeyError, TypeError, ValueError) as exc:
            raise TransferError(f"bad kv header: {exc!r}") from None
        if type(request_id) is not int or type(start) is not int or start < 0:
            raise TransferError("kv header: 'id' and 'start' must be integers")
        if dtype not in DTYPES:
            raise TransferError(f"kv header: unknown dtype {dtype!r}")
        if type(checksum) is not int:
            raise TransferError("kv header: 'checksum' must be an integer")
        if (
            not isinstance(shape, list)
            or len(shape) != 5
            or not all(type(dim) is int and dim > 0 for dim in shape)
        ):
            raise TransferError(f"kv header: bad shape {shape!r}")
        layers, heads, head_dim = expect
        if shape[0] != 2 or (shape[1], shape[3], shape[4]) != (layers, heads, head_dim):
            raise TransferError(f"kv header: shape {shape} does not fit this model")
        return cls(
            request_id=request_id,
            start=start,
            dtype=dtype,
            shape=tuple(shape),
            checksum=checksum,
            compute_ms=compute_ms,
        )


def tcp_store(port: int, world_size: int, *, is_master: bool, timeout_s: float) -> Any:
    """The rendezvous store on 127.0.0.1 (``port`` 0 on the master picks a free one)."""
    return dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1",
        port,
        world_size,
        is_master,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def connect_group(store: Any, rank: int, world_size: int, timeout_s: float) -> Any:
    """A gloo process group over ``store``; returns once every rank has joined."""
    timeout = datetime.timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore(_STORE_PREFIX, store)  # type: ignore[attr-defined]
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)

from __future__ import annotations

import pytest
import torch

from yieldgate.harness.transfer import (
    KvHeader,
    TransferError,
    decode_message,
    encode_message,
    kv_checksum,
)

EXPECT = (4, 4, 64)


def kv(tokens: int = 3) -> torch.Tensor:
    return torch.arange(2 * 4 * tokens * 4 * 64, dtype=torch.float32).view(2, 4, tokens, 4, 64)


def test_a_header_round_trips_and_checks_the_payload() -> None:
    payload = kv()
    header = KvHeader.for_tensor(7, 16, payload, compute_ms=1.5)
    again = KvHeader.from_message(
        decode_message(encode_message(header.to_message())), expect=EXPECT
    )
    assert again == header
    assert again.tokens == 3
    assert again.nbytes == payload.numel() * 4
    assert kv_checksum(payload) == header.checksum
    corrupted = payload.clone()
    corrupted.view(-1)[5] += 1
    assert kv_checksum(corrupted) != header.checksum


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dtype": "int64"}, "dtype"),
        ({"shape": [2, 4, 3, 4]}, "shape"),
        ({"shape": [2, 4, 0, 4, 64]}, "shape"),
        ({"shape": [2, 5, 3, 4, 64]}, "does not fit"),
        ({"shape": [3, 4, 3, 4, 64]}, "does not fit"),
        ({"id": "7"}, "integers"),
        ({"start": -1}, "integers"),
        ({"checksum": 1.5}, "checksum"),
    ],
)
def test_bad_headers_are_refused_before_any_byte_is_received(
    change: dict[str, object], message: str
) -> None:
    good = KvHeader.for_tensor(7, 0, kv()).to_message()
    with pytest.raises(TransferError, match=message):
        KvHeader.from_message({**good, **change}, expect=EXPECT)
    missing = dict(good)
    del missing["checksum"]
    with pytest.raises(TransferError, match="bad kv header"):
        KvHeader.from_message(missing, expect=EXPECT)


@pytest.mark.parametrize("raw", [b"", b"\xff", b"[]", b'{"no": "op"}', b"x" * 20_000_000])
def test_bad_control_messages(raw: bytes) -> None:
    with pytest.raises(TransferError):
        decode_message(raw)


def test_checksum_needs_a_contiguous_cpu_tensor() -> None:
    with pytest.raises(ValueError, match="contiguous"):
        kv_checksum(kv().transpose(0, 1))

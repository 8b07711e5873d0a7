"""The msgspec fast path for submits: it may only accept what the reference decoder accepts."""

from __future__ import annotations

import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yieldgate.protocol import FrameError, decode_request, encode_frame, sha256_hex, submit_frame
from yieldgate.server._fastframe import fast_submit_decoder

SECRETS = [None, "s3cret"]

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
fields = {
    "op": st.sampled_from(["submit", "cancel", "ping", "stats", "Submit", 3]),
    "id": st.text(max_size=8) | st.integers(),
    "body": st.text(max_size=20) | st.none() | st.integers(),
    "priority": st.sampled_from(["high", "normal", "low", "urgent", None, 1]),
    "deadline_ms": st.integers(min_value=-(2**60), max_value=2**60)
    | st.sampled_from([None, 1.5, 1.0, True]),
    "stream": st.sampled_from([True, False, None, 0, "yes"]),
    "params": st.dictionaries(st.text(max_size=5), values, max_size=3)
    | st.sampled_from([None, [1]]),
    "auth": st.sampled_from(["s3cret", "wrong", None, 7]),
}


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    obj: dict[str, Any] = {}
    for name, strategy in fields.items():
        if draw(st.booleans()):
            obj[name] = draw(strategy)
    body = obj.get("body")
    digest = draw(st.sampled_from(["right", "wrong", "missing", "upper"]))
    if digest != "missing":
        text = body if isinstance(body, str) else ""
        real = sha256_hex(text)
        obj["sha256"] = {"right": real, "wrong": sha256_hex(text + "!"), "upper": real.upper()}[
            digest
        ]
    if draw(st.booleans()):
        obj["extra"] = draw(values)
    return encode_frame(obj)[:-1]


@pytest.mark.parametrize("secret", SECRETS)
@given(line=frames())
@settings(max_examples=600, deadline=None)  # a loaded machine is slow, not wrong
def test_fast_path_accepts_only_what_the_reference_accepts(secret: str | None, line: bytes) -> None:
    fast = fast_submit_decoder(secret)
    assert fast is not None
    accepted = fast(line)
    try:
        reference = decode_request(line, secret=secret)
    except FrameError:
        assert accepted is None
        return
    assert accepted is None or accepted.request() == reference


@pytest.mark.parametrize("secret", SECRETS)
@given(
    body=st.text(max_size=50),
    priority=st.sampled_from(["high", "normal", "low"]),
    deadline=st.none() | st.integers(min_value=-(10**9), max_value=10**9),
    stream=st.booleans(),
)
@settings(deadline=None)
def test_well_formed_submits_take_the_fast_path(
    secret: str | None, body: str, priority: str, deadline: int | None, stream: bool
) -> None:
    line = encode_frame(
        submit_frame(
            "id", body, priority=priority, deadline_ms=deadline, stream=stream, auth=secret
        )
    )[:-1]
    fast = fast_submit_decoder(secret)
    assert fast is not None
    accepted = fast(line)
    assert accepted is not None
    assert accepted.request() == decode_request(line, secret=secret)


def test_everything_else_falls_back() -> None:
    fast = fast_submit_decoder(None)
    assert fast is not None
    for line in (
        b'{"op":"ping","id":"p"}',
        b'{"op":"cancel","id":"c"}',
        # A cancel that also carries a submit's fields is still a cancel (protocol 1.1).
        b'{"op":"cancel","id":"c","body":"","sha256":"' + sha256_hex("").encode() + b'"}',
        b"not json",
        b'{"op":"submit","id":"\\ud800","body":"","sha256":"' + sha256_hex("").encode() + b'"}',
        b'{"op":"submit","id":"a","body":"x","sha256":"' + sha256_hex("y").encode() + b'"}',
        b'{"op":"submit","id":"a","body":"x","sha256":"'
        + sha256_hex("x").encode()
        + b'","deadline_ms":'
        + str(2**53).encode()
        + b"}",
        # Found by bench/fuzz_frames.py: invalid UTF-8 inside a string raised
        # UnicodeDecodeError, and inside an unknown key it was skipped unchecked.
        b'{"op":"submit","id":"a\xff","body":"","sha256":"' + sha256_hex("").encode() + b'"}',
        b'{"op":"submit","id":"a","body":"\xc3","sha256":"' + sha256_hex("").encode() + b'"}',
        b'{"op":"submit","id":"a","body":"","sha256":"'
        + sha256_hex("").encode()
        + b'","pri\xcfty":"low"}',
        b'{"op":"submit","id":"a","body":"","sha256":"' + sha256_hex("").encode() + b'","x":1}',
    ):
        assert fast(line) is None


def test_without_msgspec_there_is_no_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "msgspec", None)
    assert fast_submit_decoder(None) is None

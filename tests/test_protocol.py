"""yieldgate.protocol: decoding, validation and encoding of governed frames."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yieldgate.protocol import (
    CancelRequest,
    ChunkReply,
    ErrorCode,
    ErrorReply,
    FrameError,
    OkReply,
    PingRequest,
    PongReply,
    Priority,
    ProtocolError,
    StatsReply,
    StatsRequest,
    SubmitRequest,
    YieldReason,
    YieldReply,
    cancel_frame,
    chunk_frame,
    decode_reply,
    decode_request,
    encode_frame,
    encode_yield,
    error_frame,
    ok_frame,
    parse_priority,
    ping_frame,
    pong_frame,
    sha256_hex,
    stats_frame,
    stats_reply_frame,
    submit_frame,
    yield_frame,
)


def wire(frame: dict[str, Any]) -> bytes:
    """A frame as the server's reader hands it over: one line, no newline."""
    return encode_frame(frame)[:-1]


def rejects(line: bytes | str, code: str, **kw: Any) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_request(line, **kw)
    assert info.value.code == code, info.value
    return info.value


# -- requests -----------------------------------------------------------------


def test_submit_with_defaults() -> None:
    req = decode_request(wire(submit_frame("a", "hi")))
    assert req == SubmitRequest(id="a", body="hi", sha256=sha256_hex("hi"))
    assert req.priority is Priority.NORMAL
    assert req.deadline_ms is None
    assert req.stream is False
    assert req.params == {}


def test_submit_with_every_field() -> None:
    frame = submit_frame(
        "b", "héllo ✓", priority="high", deadline_ms=1500, stream=True, params={"max_tokens": 3}
    )
    req = decode_request(wire(frame))
    assert isinstance(req, SubmitRequest)
    assert (req.id, req.body, req.priority, req.deadline_ms, req.stream) == (
        "b",
        "héllo ✓",
        Priority.HIGH,
        1500,
        True,
    )
    assert req.params == {"max_tokens": 3}


def test_sha256_is_over_utf8_bytes() -> None:
    assert sha256_hex("é") == hashlib.sha256(b"\xc3\xa9").hexdigest()
    assert len(sha256_hex("")) == 64


def test_stats_and_ping() -> None:
    assert decode_request(wire(stats_frame("s"))) == StatsRequest(id="s")
    assert decode_request(wire(ping_frame("p"))) == PingRequest(id="p")


def test_unknown_fields_are_ignored() -> None:
    frame = {**submit_frame("a", "x"), "future_field": [1, 2]}
    assert isinstance(decode_request(wire(frame)), SubmitRequest)


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b"not json", "not valid JSON"),
        (b"", "not valid JSON"),
        (b"[1, 2]", "an array"),
        (b'"text"', "a string"),
        (b"42", "a number"),
        (b"null", "null"),
        (b"\xff\xfe{}", "UTF-8"),
        (b"[" * 100_000 + b"]" * 100_000, "nested"),
        (b'{"op": "submit", "id": "a", "x": NaN}', "NaN"),
        (b'{"op": "ping", "id": "a", "x": Infinity}', "Infinity"),
    ],
)
def test_lines_that_are_not_objects_are_bad_frames(line: bytes, fragment: str) -> None:
    err = rejects(line, ErrorCode.BAD_FRAME)
    assert fragment in err.message
    assert err.request_id is None


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"op": None}, "'op'"),
        ({"op": 3}, "'op'"),
        ({"body": None}, "'body'"),
        ({"body": 5}, "'body'"),
        ({"sha256": None}, "'sha256'"),
        ({"sha256": "ABC"}, "64 lowercase hex"),
        ({"sha256": "A" * 64}, "64 lowercase hex"),
        ({"sha256": "g" * 64}, "64 lowercase hex"),
        ({"priority": "urgent"}, "'priority'"),
        ({"priority": 1}, "'priority'"),
        ({"deadline_ms": 1.5}, "'deadline_ms'"),
        ({"deadline_ms": "100"}, "'deadline_ms'"),
        ({"deadline_ms": True}, "'deadline_ms'"),
        ({"stream": "yes"}, "'stream'"),
        ({"stream": 1}, "'stream'"),
        ({"params": [1]}, "'params'"),
    ],
)
def test_bad_submit_fields_are_bad_frames_with_the_id(
    change: dict[str, Any], fragment: str
) -> None:
    frame = {**submit_frame("keep-me", "body"), **change}
    frame = {k: v for k, v in frame.items() if v is not None}
    err = rejects(wire(frame), ErrorCode.BAD_FRAME)
    assert fragment in err.message
    assert err.request_id == "keep-me"


def test_deadline_must_be_representable() -> None:
    frame = submit_frame("a", "x", deadline_ms=2**53 - 1)
    assert decode_request(wire(frame)).deadline_ms == 2**53 - 1  # type: ignore[union-attr]
    err = rejects(wire({**frame, "deadline_ms": 2**53}), ErrorCode.BAD_FRAME)
    assert "deadline_ms" in err.message
    rejects(wire({**frame, "deadline_ms": -(10**400)}), ErrorCode.BAD_FRAME)


def test_lone_surrogates_are_bad_frames() -> None:
    # JSON escapes can spell code points UTF-8 cannot carry.
    err = rejects(b'{"op": "ping", "id": "\\ud800"}', ErrorCode.BAD_FRAME)
    assert err.request_id is None
    err = rejects(
        b'{"op": "submit", "id": "b", "body": "\\udfff", "sha256": "' + b"0" * 64 + b'"}',
        ErrorCode.BAD_FRAME,
    )
    assert (err.request_id, "surrogate" in err.message) == ("b", True)


def test_null_optional_fields_mean_absent() -> None:
    frame = {
        **submit_frame("a", "x"),
        "priority": None,
        "deadline_ms": None,
        "stream": None,
        "params": None,
    }
    req = decode_request(wire(frame))
    assert isinstance(req, SubmitRequest)
    assert (req.priority, req.deadline_ms, req.stream, req.params) == (
        Priority.NORMAL,
        None,
        False,
        {},
    )


@pytest.mark.parametrize("bad_id", [None, 7, ["a"], {"a": 1}, True])
def test_id_must_be_a_string(bad_id: Any) -> None:
    frame: dict[str, Any] = {"op": "ping"}
    if bad_id is not None:
        frame["id"] = bad_id
    err = rejects(wire(frame), ErrorCode.BAD_FRAME)
    assert err.request_id is None


def test_unknown_op() -> None:
    err = rejects(wire({"op": "abort", "id": "q"}), ErrorCode.UNKNOWN_OP)
    assert err.request_id == "q"


def test_cancel_decodes_with_its_id_and_auth() -> None:
    assert decode_request(wire(cancel_frame("q"))) == CancelRequest(id="q")
    secret = "s3cret"
    assert decode_request(wire(cancel_frame("q", auth=secret)), secret=secret) == CancelRequest(
        id="q"
    )
    rejects(wire(cancel_frame("q")), ErrorCode.UNAUTHORIZED, secret=secret)
    rejects(wire({"op": "cancel"}), ErrorCode.BAD_FRAME)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("high", Priority.HIGH),
        ("High", Priority.HIGH),
        (" LOW ", Priority.LOW),
        ("Normal", Priority.NORMAL),
    ],
)
def test_header_priorities_are_read_whatever_their_case(value: str, expected: Priority) -> None:
    assert parse_priority(value) is expected


def test_a_header_priority_that_is_no_priority_is_none() -> None:
    assert parse_priority("urgent") is None
    assert parse_priority("") is None


def test_integrity_mismatch() -> None:
    frame = submit_frame("c", "original")
    frame["body"] = "tampered"
    err = rejects(wire(frame), ErrorCode.INTEGRITY_MISMATCH)
    assert err.request_id == "c"


def test_auth_required_when_secret_set() -> None:
    ok = decode_request(wire(submit_frame("a", "x", auth="s3cret")), secret="s3cret")
    assert isinstance(ok, SubmitRequest)
    rejects(wire(submit_frame("a", "x")), ErrorCode.UNAUTHORIZED, secret="s3cret")
    rejects(wire(submit_frame("a", "x", auth="wrong")), ErrorCode.UNAUTHORIZED, secret="s3cret")
    rejects(wire({"op": "ping", "id": "p", "auth": 5}), ErrorCode.UNAUTHORIZED, secret="s3cret")
    rejects(wire(stats_frame("s")), ErrorCode.UNAUTHORIZED, secret="s3cret")


def test_auth_is_checked_before_anything_else_about_the_request() -> None:
    # An unauthenticated peer learns nothing about ops or integrity.
    rejects(wire({"op": "nope", "id": "x"}), ErrorCode.UNAUTHORIZED, secret="k")
    tampered = {**submit_frame("x", "a"), "body": "b"}
    rejects(wire(tampered), ErrorCode.UNAUTHORIZED, secret="k")


def test_a_lone_surrogate_auth_is_unauthorized_not_a_crash() -> None:
    err = rejects(
        b'{"op": "ping", "id": "p", "auth": "\\ud800"}', ErrorCode.UNAUTHORIZED, secret="k"
    )
    assert err.request_id == "p"


def test_auth_is_ignored_without_a_secret() -> None:
    assert isinstance(decode_request(wire(ping_frame("p", auth="anything"))), PingRequest)


def test_str_lines_are_accepted_too() -> None:
    assert decode_request(json.dumps(ping_frame("p"))) == PingRequest(id="p")


# -- encoding -----------------------------------------------------------------


def test_encode_is_one_compact_line() -> None:
    data = encode_frame({"id": "a", "text": "line1\nline2", "u": "é"})
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1
    assert "é".encode() in data  # UTF-8, not \\u escapes


@pytest.mark.parametrize("value", [math.nan, math.inf, {1, 2}, object()])
def test_encode_rejects_what_json_cannot_carry(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        encode_frame({"result": value})


def test_submit_frame_omits_defaults() -> None:
    frame = submit_frame("a", "x")
    assert set(frame) == {"op", "id", "body", "sha256"}


def test_error_frame_default_retryable() -> None:
    assert error_frame("a", "shutting_down", "m")["retryable"] is True
    assert error_frame("a", "integrity_mismatch", "m")["retryable"] is True
    assert error_frame("a", "bad_frame", "m")["retryable"] is False
    assert error_frame("a", "backend_error", "m", retryable=True)["retryable"] is True
    with pytest.raises(ValueError, match="not_a_code"):
        error_frame("a", "not_a_code", "m")


def test_yield_hint_is_never_negative() -> None:
    frame = yield_frame("a", retry_hint_ms=-5, inflight=1, max_inflight=1, reason="saturated")
    assert frame["retry_hint_ms"] == 0


# -- replies ------------------------------------------------------------------


def test_replies_round_trip() -> None:
    assert decode_reply(wire(ok_frame("a", {"t": 1}, 12.3456))) == OkReply(
        id="a", result={"t": 1}, exec_ms=12.346
    )
    y = yield_frame("b", retry_hint_ms=40, inflight=2, max_inflight=2, reason=YieldReason.SLO)
    assert decode_reply(wire(y)) == YieldReply(
        id="b", retry_hint_ms=40, inflight=2, max_inflight=2, reason="slo"
    )
    e = error_frame(None, ErrorCode.BAD_FRAME, "nope")
    assert decode_reply(wire(e)) == ErrorReply(
        id=None, code="bad_frame", message="nope", retryable=False
    )
    assert decode_reply(wire(chunk_frame("c", 3, "tok"))) == ChunkReply(id="c", seq=3, data="tok")
    assert decode_reply(wire(pong_frame("p"))) == PongReply(id="p")
    counters = {
        "inflight": 1,
        "max_inflight": 4,
        "executed_total": 9,
        "yielded_total": 2,
        "errors_total": 0,
        "extra": "kept",
    }
    stats = decode_reply(wire(stats_reply_frame("s", counters)))
    assert isinstance(stats, StatsReply)
    assert stats.counters == counters
    assert (stats.inflight, stats.max_inflight) == (1, 4)


@pytest.mark.parametrize(
    "line",
    [
        b"garbage",
        b"[]",
        b'{"status": "ok"}',
        b'{"id": "a", "status": "weird"}',
        b'{"id": "a", "status": "ok", "exec_ms": 1}',
        b'{"id": "a", "status": "ok", "result": 1, "exec_ms": "1"}',
        b'{"id": "a", "status": "yield", "retry_hint_ms": -1, "inflight": 1, '
        b'"max_inflight": 1, "reason": "saturated"}',
        b'{"id": "a", "status": "yield", "retry_hint_ms": true, "inflight": 1, '
        b'"max_inflight": 1, "reason": "saturated"}',
        b'{"id": "a", "status": "yield", "inflight": 1, "max_inflight": 1, "reason": "x"}',
        b'{"id": "a", "status": "chunk", "seq": -1, "data": 1}',
        b'{"id": "a", "status": "ok", "op": "stats", "inflight": 1}',
        b'{"id": 5, "status": "error", "code": "bad_frame"}',
        b'{"id": "a", "status": "error"}',
    ],
)
def test_invalid_replies_raise_protocol_error(line: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_reply(line)


# -- properties ---------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=512))
@settings(max_examples=500, deadline=None)
def test_any_bytes_decode_or_raise_frame_error(data: bytes) -> None:
    try:
        decode_request(data)
    except FrameError as exc:
        assert exc.code in {c.value for c in ErrorCode}


@given(
    st.dictionaries(
        st.sampled_from(
            ["op", "id", "body", "sha256", "priority", "deadline_ms", "stream", "params", "auth"]
        )
        | st.text(),
        json_values,
        max_size=9,
    )
)
@settings(max_examples=500, deadline=None)
def test_any_json_object_decodes_or_raises_frame_error(obj: dict[str, Any]) -> None:
    try:
        req = decode_request(wire(obj))
    except FrameError:
        return
    assert req.id == obj["id"]
    if isinstance(req, SubmitRequest):
        assert sha256_hex(req.body) == obj["sha256"]


@given(
    rid=st.text(max_size=40),
    body=st.text(max_size=300),
    priority=st.sampled_from(list(Priority)),
    deadline=st.none() | st.integers(min_value=-(10**12), max_value=10**12),
    stream=st.booleans(),
    params=st.dictionaries(st.text(max_size=10), json_values, max_size=3),
)
def test_submit_round_trips(
    rid: str,
    body: str,
    priority: Priority,
    deadline: int | None,
    stream: bool,
    params: dict[str, Any],
) -> None:
    frame = submit_frame(
        rid, body, priority=priority, deadline_ms=deadline, stream=stream, params=params
    )
    req = decode_request(wire(frame))
    assert req == SubmitRequest(
        id=rid,
        body=body,
        sha256=sha256_hex(body),
        priority=priority,
        deadline_ms=deadline,
        stream=stream,
        params=params,
    )


@given(
    body=st.text(min_size=1, max_size=200),
    position=st.integers(min_value=0),
    flip=st.integers(1, 255),
)
@settings(max_examples=500, deadline=None)
def test_a_corrupted_frame_is_never_accepted_with_another_body(
    body: str, position: int, flip: int
) -> None:
    line = bytearray(wire(submit_frame("id-1", body)))
    line[position % len(line)] ^= flip
    try:
        req = decode_request(bytes(line))
    except FrameError as exc:
        assert exc.code in {ErrorCode.BAD_FRAME, ErrorCode.INTEGRITY_MISMATCH, ErrorCode.UNKNOWN_OP}
        return
    # The flip landed somewhere harmless (the id, a key's spelling, whitespace):
    # whatever was accepted still carries exactly the body that was sent.
    if isinstance(req, SubmitRequest):
        assert req.body == body


@given(st.binary(max_size=512))
@settings(max_examples=300, deadline=None)
def test_any_bytes_decode_as_reply_or_raise_protocol_error(data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        decode_reply(data)


@given(rid=st.text(max_size=20), result=json_values, exec_ms=st.floats(0, 1e9))
def test_ok_replies_round_trip(rid: str, result: Any, exec_ms: float) -> None:
    reply = decode_reply(wire(ok_frame(rid, result, exec_ms)))
    assert isinstance(reply, OkReply)
    assert reply.id == rid
    assert reply.result == result


@given(
    rid=st.text(max_size=30),
    hint=st.integers(min_value=-5, max_value=10**9),
    inflight=st.integers(min_value=0, max_value=10**6),
    cap=st.integers(min_value=0, max_value=10**6),
    reason=st.sampled_from(list(YieldReason)),
)
def test_the_yield_template_matches_the_generic_encoder(
    rid: str, hint: int, inflight: int, cap: int, reason: YieldReason
) -> None:
    frame = yield_frame(rid, retry_hint_ms=hint, inflight=inflight, max_inflight=cap, reason=reason)
    fast = encode_yield(rid, retry_hint_ms=hint, inflight=inflight, max_inflight=cap, reason=reason)
    assert fast == encode_frame(frame)


def test_a_huge_exec_ms_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match="exec_ms"):
        decode_reply(b'{"id":"a","status":"ok","result":1,"exec_ms":' + b"9" * 400 + b"}")

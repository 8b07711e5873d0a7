"""``yieldgate._headers``: every header name once, in the form the wire carries it."""

from __future__ import annotations

from yieldgate import _headers, protocol


def test_each_name_is_defined_once() -> None:
    values = [getattr(_headers, name) for name in _headers.__all__]
    assert len(set(values)) == len(values)


def test_header_names_are_lower_case_as_asgi_carries_them() -> None:
    headers = [n for n in _headers.__all__ if n.endswith("_HEADER")]
    # The idempotency key keeps openai-python's casing; the server never reads it.
    mixed = [n for n in headers if getattr(_headers, n) != getattr(_headers, n).lower()]
    assert mixed == ["IDEMPOTENCY_KEY_HEADER"]


def test_the_protocol_module_exports_the_same_two() -> None:
    assert protocol.PRIORITY_HEADER is _headers.PRIORITY_HEADER == "x-yieldgate-priority"
    assert protocol.DEADLINE_HEADER is _headers.DEADLINE_HEADER == "x-yieldgate-deadline-ms"

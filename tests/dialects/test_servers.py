"""Each server's overload and rate-limit replies, run through the table in docs/http.md.

The table "What each server sends" is the specification: every row names a
fixture of server_replies.py, a dialect and the outcome, and each row is run
here on httpx and httpx2 responses. Every fixture must have a row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import httpx2
import pytest

from yieldgate import RemoteError
from yieldgate.dialects import (
    ANTHROPIC,
    DIALECTS,
    GEMINI,
    GOVERNED_HTTP,
    HUGGINGFACE,
    OPENAI,
    TGI,
    HttpDialect,
    get_dialect,
)
from yieldgate.dialects._hints import message_hint_s
from yieldgate.gate import OutcomeKind

from .server_replies import REPLIES, ServerReply

HTTP_MD = Path(__file__).resolve().parents[2] / "docs" / "http.md"
SECTION = "## What each server sends"
ALL = (OPENAI, ANTHROPIC, GEMINI, HUGGINGFACE, TGI, GOVERNED_HTTP)
_OUTCOME = re.compile(
    r"(?P<kind>yield|overloaded|retryable|fatal|ok)"
    r"(?: `(?P<reason>[^`]+)`)?"
    r"(?:, hint (?P<hint>[0-9.]+) s)?"
)


class Row(NamedTuple):
    server: str
    fixture: str
    dialect: str
    kind: OutcomeKind
    reason: str | None
    hint_s: float | None


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def table_rows(text: str) -> list[Row]:
    """The rows of the table under ``SECTION``, parsed; malformed rows fail loudly."""
    lines = text.split(SECTION, 1)[1].split("\n## ", 1)[0].splitlines()
    table = [line for line in lines if line.startswith("|")]
    assert _cells(table[0]) == ["server", "reply", "fixture", "dialect", "outcome"]
    rows = []
    for line in table[2:]:
        server, _reply, fixture, dialect, outcome = _cells(line)
        match = _OUTCOME.fullmatch(outcome)
        assert match is not None, f"unreadable outcome {outcome!r}"
        hint = match["hint"]
        rows.append(
            Row(
                server,
                fixture.strip("`"),
                dialect.strip("`"),
                OutcomeKind(match["kind"]),
                match["reason"],
                None if hint is None else float(hint),
            )
        )
    return rows


ROWS = table_rows(HTTP_MD.read_text(encoding="utf-8"))


def test_the_table_has_a_row_for_every_fixture_and_a_fixture_for_every_row() -> None:
    assert {row.fixture for row in ROWS} == set(REPLIES)
    assert {row.dialect for row in ROWS} <= set(DIALECTS)


@pytest.mark.parametrize("lib", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize("row", ROWS, ids=lambda row: f"{row.fixture}-{row.dialect}")
def test_each_row_of_the_table(row: Row, lib: Any) -> None:
    response = REPLIES[row.fixture].response(lib)
    outcome = get_dialect(row.dialect).classify(response)
    assert (outcome.kind, outcome.reason) == (row.kind, row.reason)
    assert outcome.value is response
    if row.hint_s is None:
        assert outcome.hint_s is None
    else:
        assert outcome.hint_s == pytest.approx(row.hint_s)


def test_the_table_parser_reads_hints_and_rejects_what_it_cannot_read() -> None:
    text = (
        f"{SECTION}\n\n| server | reply | fixture | dialect | outcome |\n| --- |\n"
        "| s | r | `f` | `openai` | yield `x`, hint 1.5 s |\n"
    )
    assert table_rows(text) == [Row("s", "f", "openai", OutcomeKind.YIELD, "x", 1.5)]
    with pytest.raises(AssertionError, match="unreadable outcome"):
        table_rows(text.replace("yield `x`", "maybe"))


# -- the server rules, beyond the table --------------------------------------------


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("fixture", ["llm-d-saturated", "ray-serve-503", "dynamo-overloaded"])
def test_server_refusals_are_yields_in_every_dialect(dialect: HttpDialect, fixture: str) -> None:
    assert dialect.classify(REPLIES[fixture].response()).kind is OutcomeKind.YIELD


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
def test_529_is_an_overloaded_yield_with_the_hint_in_every_dialect(dialect: HttpDialect) -> None:
    outcome = dialect.classify(httpx.Response(529, headers={"retry-after": "3"}))
    assert (outcome.kind, outcome.reason, outcome.hint_s) == (OutcomeKind.YIELD, "overloaded", 3)


@pytest.mark.parametrize("dialect", ALL, ids=lambda d: d.name)
@pytest.mark.parametrize("fixture", sorted(REPLIES))
def test_x_should_retry_false_beats_every_server_rule(dialect: HttpDialect, fixture: str) -> None:
    reply = REPLIES[fixture]
    headers = {**reply.headers, "x-should-retry": "false"}
    response = ServerReply(reply.status, reply.body, headers).response()
    assert dialect.classify(response).kind is OutcomeKind.FATAL


def test_llm_d_reasons_whatever_their_case_and_unknown_ones_fall_to_the_status() -> None:
    def classify(status: int, dropped: str) -> Any:
        headers = {"X-LLM-D-Request-Dropped-Reason": dropped}
        return OPENAI.classify(httpx.Response(status, headers=headers, content=b"x"))

    outcome = classify(503, " Rejected-Shutting-Down ")
    assert (outcome.kind, outcome.reason) == (OutcomeKind.YIELD, "shutting_down")
    evicted = classify(429, "evicted-queue-pressure")
    assert (evicted.kind, evicted.reason) == (OutcomeKind.OVERLOADED, "evicted_queue_pressure")
    assert isinstance(evicted.error, RemoteError)
    assert "request evicted" not in str(evicted.error)  # the body here is "x"
    unknown = classify(503, "something-new")
    assert (unknown.kind, unknown.reason) == (OutcomeKind.OVERLOADED, "unavailable")


def test_a_503_that_is_not_a_server_refusal_stays_overloaded() -> None:
    for body in (
        {"error": {"message": "upstream connect error", "type": "Service Unavailable"}},
        {"message": "Service temporarily unavailable", "type": "service_unavailable"},
        "Request dropped: no healthy upstream",
        "<html>503</html>",
    ):
        outcome = OPENAI.classify(ServerReply(503, body).response())
        assert (outcome.kind, outcome.reason) == (OutcomeKind.OVERLOADED, "unavailable")


def test_a_plain_text_body_is_the_error_message() -> None:
    outcome = OPENAI.classify(REPLIES["llm-d-evicted"].response())
    assert str(outcome.error).startswith("HTTP 429: request evicted by flow control")
    dynamo = OPENAI.classify(ServerReply(503, {"message": "down", "type": "x"}).response())
    assert str(dynamo.error).startswith("HTTP 503: down")


def test_a_header_hint_wins_over_the_message() -> None:
    reply = REPLIES["openai-rate-limit"]
    headers = {**reply.headers, "retry-after-ms": "250"}
    outcome = OPENAI.classify(ServerReply(429, reply.body, headers).response())
    assert outcome.hint_s == 0.25


def test_only_openai_reads_a_hint_in_the_message() -> None:
    outcome = TGI.classify(REPLIES["openai-rate-limit"].response())
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, None)


@pytest.mark.parametrize(
    ("message", "hint"),
    [
        ("Please try again in 1.234s. Visit ...", 1.234),
        ("Please try again in 20ms.", 0.02),
        ("Please try again in 6m0s.", 360.0),
        ("Please try again in 1h2m3.5s.", 3723.5),
        ("Please retry after 6 seconds. Please go here", 6.0),
        ("Please Retry After 1 second", 1.0),
        ("try again later", None),
        ("retry after a while", None),
        ("", None),
    ],
)
def test_message_hints(message: str, hint: float | None) -> None:
    assert message_hint_s(message) == (None if hint is None else pytest.approx(hint))


def test_anthropic_dialect() -> None:
    assert get_dialect("anthropic") is ANTHROPIC
    assert ANTHROPIC.idempotency_header is None
    # Its own error types, whatever the status; the rest as every dialect reads them.
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    outcome = ANTHROPIC.classify(ServerReply(503, body).response())
    assert (outcome.kind, outcome.reason) == (OutcomeKind.YIELD, "overloaded")
    body = {"type": "error", "error": {"type": "api_error", "message": "Internal"}}
    assert ANTHROPIC.classify(ServerReply(500, body).response()).kind is OutcomeKind.RETRYABLE
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    assert ANTHROPIC.classify(ServerReply(400, body).response()).kind is OutcomeKind.FATAL

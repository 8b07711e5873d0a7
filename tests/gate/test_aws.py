"""An AWS SDK's refusals under the Gate (issue 40, defect 4): boto3 clients (Bedrock's
``converse`` among them) raise botocore's ``ClientError``, with no ``status_code``; on
the tree before this, a ``ThrottlingException`` was fatal after one attempt."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EventStreamError

from yieldgate import Gate, GatePolicy, RetryPolicy
from yieldgate.gate import OutcomeKind, default_classify

pytestmark = pytest.mark.anyio


def client_error(code: str, status: int, headers: dict[str, str] | None = None) -> ClientError:
    response: Any = {
        "Error": {"Code": code, "Message": f"{code} from the fake"},
        "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
    }
    return ClientError(response, "Converse")


@pytest.mark.parametrize(
    ("code", "status", "kind", "reason"),
    [
        ("ThrottlingException", 429, OutcomeKind.YIELD, "rate_limited"),
        ("TooManyRequestsException", 429, OutcomeKind.YIELD, "rate_limited"),
        ("ModelNotReadyException", 429, OutcomeKind.YIELD, "cold_start"),
        ("ServiceUnavailableException", 503, OutcomeKind.OVERLOADED, "unavailable"),
        ("ModelTimeoutException", 408, OutcomeKind.RETRYABLE, "ModelTimeoutException"),
        ("InternalServerException", 500, OutcomeKind.RETRYABLE, "InternalServerException"),
        ("ValidationException", 400, OutcomeKind.FATAL, None),
        ("AccessDeniedException", 403, OutcomeKind.FATAL, None),
    ],
)
def test_a_client_error_is_classified_by_its_code(
    code: str, status: int, kind: OutcomeKind, reason: str | None
) -> None:
    error = client_error(code, status)
    outcome = default_classify(None, error)
    assert (outcome.kind, outcome.reason) == (kind, reason)
    assert outcome.error is error  # a call that fails ends with it


def test_a_retry_after_header_is_the_hint() -> None:
    outcome = default_classify(None, client_error("ThrottlingException", 429, {"retry-after": "3"}))
    assert (outcome.kind, outcome.hint_s) == (OutcomeKind.YIELD, 3.0)


def test_a_throttled_stream_is_a_yield_too() -> None:
    response: Any = {"Error": {"Code": "throttlingException", "Message": "slow down"}}
    stream_error = EventStreamError(response, "ConverseStream")
    # Bedrock's stream events spell the code in camel case: read as sent, left fatal.
    assert default_classify(None, stream_error).kind is OutcomeKind.FATAL
    response["Error"]["Code"] = "ThrottlingException"
    assert default_classify(None, EventStreamError(response, "ConverseStream")).kind is (
        OutcomeKind.YIELD
    )


async def test_bedrock_throttled_once_is_served_on_the_retry() -> None:
    gate = Gate(GatePolicy(retry=RetryPolicy(base_s=0.01, max_backoff_s=0.02)), name="bedrock")
    calls = 0

    async def converse() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise client_error("ThrottlingException", 429)
        return "served"

    assert await gate.call(converse) == "served"  # on main: ClientError, after 1 attempt
    assert calls == 2

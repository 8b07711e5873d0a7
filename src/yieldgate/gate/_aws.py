"""What an AWS SDK error means for the Gate: botocore's ``ClientError`` by its code.

boto3 clients (Bedrock's ``converse`` and ``invoke_model`` among them) raise
``botocore.exceptions.ClientError`` for every refusal, with no
``status_code``: the code is in ``error.response["Error"]["Code"]``. Read by
name, so nothing here imports botocore:

- throttling (``ThrottlingException``, ``TooManyRequestsException``, the
  older ``Throttling`` and ``RequestLimitExceeded``, DynamoDB-style
  ``ProvisionedThroughputExceededException``): a ``yield``, ``rate_limited``,
  with a ``Retry-After`` header's hint when the response carries one;
- ``ServiceUnavailableException``: ``overloaded``; ``ModelNotReadyException``
  (a Bedrock model being loaded): a ``yield``, ``cold_start``;
- ``ModelTimeoutException``, ``InternalServerException`` and
  ``InternalFailure``: ``retryable``;
- any other code (validation, access, a quota of the account): ``None``, left
  to the caller's classifier (the default: ``fatal``).
"""

from __future__ import annotations

from typing import Any, Final

from yieldgate.gate._outcome import Outcome, OutcomeKind, sanitize_hint_s

__all__ = ["aws_outcome"]

_YIELDS: Final = {
    "ThrottlingException": "rate_limited",
    "TooManyRequestsException": "rate_limited",
    "Throttling": "rate_limited",
    "RequestLimitExceeded": "rate_limited",
    "ProvisionedThroughputExceededException": "rate_limited",
    "ModelNotReadyException": "cold_start",
}
_RETRYABLE: Final = frozenset(
    {"ModelTimeoutException", "InternalServerException", "InternalFailure"}
)


def _is_client_error(error: BaseException) -> bool:
    return any(
        cls.__name__ == "ClientError" and cls.__module__.startswith("botocore")
        for cls in type(error).__mro__
    )


def aws_outcome(error: BaseException) -> Outcome | None:
    """The outcome of a botocore ``ClientError`` (see the module docstring), or ``None``."""
    if not _is_client_error(error):
        return None
    response: Any = getattr(error, "response", None)
    if not isinstance(response, dict):
        return None
    code = (response.get("Error") or {}).get("Code")
    headers = (response.get("ResponseMetadata") or {}).get("HTTPHeaders") or {}
    hint = None
    if isinstance(headers, dict):
        retry_after = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
        if retry_after is not None:
            try:
                hint = sanitize_hint_s(float(retry_after))
            except (TypeError, ValueError):
                hint = None
    if code in _YIELDS:
        return Outcome(OutcomeKind.YIELD, None, hint, _YIELDS[code], error)
    if code == "ServiceUnavailableException":
        return Outcome.overloaded(hint, reason="unavailable", error=error)
    if code in _RETRYABLE:
        return Outcome.retryable(error, hint_s=hint, reason=code)
    return None

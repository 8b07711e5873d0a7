"""What the Gemini API's error bodies say, for the ``gemini`` dialect.

The Gemini API answers an error with a ``google.rpc.Status`` as JSON (Google's
AIP-193), whose ``details`` are typed by their ``@type``::

    {"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "...",
               "details": [
                 {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                  "violations": [{"quotaMetric": "...", "quotaValue": "250",
                                  "quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
                 {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"}]}}

``retry_delay_s`` reads ``RetryInfo.retryDelay``: a ``google.protobuf.Duration``
in its JSON form, seconds with up to nine fractional digits and an ``s``
(``"20s"``, ``"1.5s"``, ``"0.250s"``); a ``{"seconds": ..., "nanos": ...}``
object is read too. ``spent_quota`` names a quota that no wait within a call
refills: one counted per day (its ``quotaId`` or ``quotaMetric`` says
``PerDay``; Gemini's daily quotas reset at midnight Pacific time), or one whose
limit is zero (``quotaValue`` ``"0"``: the tier has no quota for that model).

Anything malformed (details that are not a list, an entry that is not an
object, a delay that is not a duration) is skipped, never an error: a bad body
must not turn a retryable answer into a crash.
"""

from __future__ import annotations

import re
from typing import Any

from yieldgate.gate._outcome import sanitize_hint_s

__all__ = ["duration_s", "retry_delay_s", "spent_quota"]

_RETRY_INFO = "google.rpc.RetryInfo"
_QUOTA_FAILURE = "google.rpc.QuotaFailure"
_DURATION = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)s\s*")
_PER_DAY = re.compile(r"per[_-]?day", re.IGNORECASE)


def _details(body: Any, kind: str) -> list[dict[str, Any]]:
    """The entries of ``error.details`` whose ``@type`` names ``kind``."""
    if isinstance(body, list) and len(body) == 1:  # Vertex AI wraps some errors in a list
        body = body[0]
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, list):
        return []
    found = []
    for entry in details:
        if not isinstance(entry, dict):
            continue
        type_url = entry.get("@type")
        # A type URL is "<host>/<full name>"; the host is not fixed.
        if isinstance(type_url, str) and type_url.rpartition("/")[2] == kind:
            found.append(entry)
    return found


def duration_s(value: Any) -> float | None:
    """A ``google.protobuf.Duration`` in seconds, from its JSON form (``"1.5s"``) or
    a ``{"seconds", "nanos"}`` object; ``None`` for anything else, negative included."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value)
        return None if match is None else sanitize_hint_s(float(match.group(1)))
    if isinstance(value, dict):
        try:
            seconds = float(value.get("seconds", 0))
            nanos = float(value.get("nanos", 0))
        except (TypeError, ValueError, OverflowError):
            return None
        return sanitize_hint_s(seconds + nanos / 1e9)
    return None


def retry_delay_s(body: Any) -> float | None:
    """The longest ``RetryInfo.retryDelay`` of an error body, in seconds, or ``None``."""
    delays = [duration_s(entry.get("retryDelay")) for entry in _details(body, _RETRY_INFO)]
    found = [delay for delay in delays if delay is not None]
    return max(found) if found else None


def spent_quota(body: Any) -> str | None:
    """``"daily_quota"`` or ``"no_quota"`` when a ``QuotaFailure`` violation names a
    quota that no wait within a call refills; ``None`` otherwise."""
    for entry in _details(body, _QUOTA_FAILURE):
        violations = entry.get("violations")
        if not isinstance(violations, list):
            continue
        for violation in violations:
            if not isinstance(violation, dict):
                continue
            names = (violation.get("quotaId"), violation.get("quotaMetric"))
            if any(isinstance(name, str) and _PER_DAY.search(name) for name in names):
                return "daily_quota"
            if str(violation.get("quotaValue", "")).strip() == "0":
                return "no_quota"
    return None

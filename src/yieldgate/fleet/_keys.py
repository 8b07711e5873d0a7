"""The key layout: every key of one upstream under one Redis Cluster hash tag.

``{prefix}:{gate}:{{{upstream}}}:{what}``: the braces around the upstream's
name are Redis Cluster's hash tag, so all of an upstream's keys hash to one
slot and a script may touch several of them at once. A prefix and a Gate's
name may not contain braces (they would move the tag); neither may an upstream's.
"""

from __future__ import annotations

__all__ = ["Keys", "check_name"]


def check_name(what: str, name: str) -> str:
    """``name`` if it may be part of a key, else ``ValueError``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} must be a non-empty string, got {name!r}")
    if "{" in name or "}" in name:
        raise ValueError(f"{what} may not contain braces (Redis Cluster hash tags): {name!r}")
    return name


class Keys:
    """Names the keys of one Gate's shared state."""

    __slots__ = ("base",)

    def __init__(self, prefix: str, gate: str) -> None:
        self.base = f"{check_name('prefix', prefix)}:{check_name('gate', gate)}"

    def tag(self, upstream: str) -> str:
        """The common start of ``upstream``'s keys, with its hash tag."""
        return f"{self.base}:{{{check_name('upstream', upstream)}}}"

    def seq(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:seq"

    @staticmethod
    def check_bucket(bucket: str) -> str:
        if not isinstance(bucket, str) or not bucket:
            raise ValueError(f"a bucket key must be a non-empty string, got {bucket!r}")
        return bucket

    def bucket(self, upstream: str, bucket: str) -> str:
        return f"{self.tag(upstream)}:quota:{self.check_bucket(bucket)}"

    def shapes(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:shapes"

    def first(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:first"

    def holds(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:holds"

    def scope_holds(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:scope-holds"

    def leases(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:leases"

    def waiters(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:waiters"

    def members(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:members"

    def budget(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:budget"

    def breaker(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:breaker"

    def probe(self, upstream: str) -> str:
        return f"{self.tag(upstream)}:probe"

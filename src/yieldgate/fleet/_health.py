"""A tiny circuit to Redis itself: a dead Redis costs no time per call.

After a failure (an error, or no answer within the budget) every call skips
Redis for a back-off, ``backoff_s`` at first and doubling to ``max_backoff_s``,
and answers ``None`` at once. When the back-off has passed, one call goes
(the trial); while it is out, the others still skip. Any answer from Redis
ends the outage. One warning per outage, one info on rejoining, on the
``yieldgate.fleet`` logger.

A refusal of the fleet's credentials or commands (a wrong password, an ACL
user without ``EVALSHA``) is no outage but a configuration error: it is kept
(``config_error``, the Gate raises it unless it fails open) and warned about
again at every failed trial, as the back-off grows, until Redis accepts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import Enum

import redis.exceptions

__all__ = ["Health", "Pass", "config_error"]

logger = logging.getLogger("yieldgate.fleet")


def config_error(error: BaseException) -> str | None:
    """What is wrong with the fleet's configuration, if ``error`` says (``None``: an
    outage, or a slow Redis). Redis's messages name no password."""
    if isinstance(
        error, redis.exceptions.AuthenticationError | redis.exceptions.AuthorizationError
    ):
        return f"Redis refused the fleet's credentials ({error})"
    if isinstance(error, redis.exceptions.AuthenticationWrongNumberOfArgsError):
        return f"Redis refused the fleet's credentials ({error})"
    if isinstance(error, redis.exceptions.NoPermissionError):
        return f"the fleet's Redis user may not run its commands ({error})"
    if isinstance(error, redis.exceptions.ResponseError):
        text = str(error)
        if text.startswith(("NOAUTH", "WRONGPASS")):
            return f"Redis refused the fleet's credentials ({text})"
        if text.startswith("NOPERM"):
            return f"the fleet's Redis user may not run its commands ({text})"
    return None


class Pass(Enum):
    """What ``Health.admit`` allows."""

    SKIP = "skip"
    GO = "go"
    TRIAL = "trial"


class Health:
    """Whether to ask Redis now; counts what happened (thread-safe, never waits)."""

    def __init__(
        self,
        name: str,
        *,
        backoff_s: float,
        max_backoff_s: float,
        clock: Callable[[], float],
    ) -> None:
        self.name = name
        self._initial = backoff_s
        self._max = max_backoff_s
        self._clock = clock
        self._lock = threading.Lock()
        self._backoff = backoff_s
        self._down_since: float | None = None
        self._retry_at = 0.0
        self._trial_out = False
        self.calls = 0
        self.fallbacks = 0
        self.outages = 0
        self.rejoins = 0
        self.config_error: str | None = None
        # Whether Redis ever answered this member: until then it is joining, and a
        # round trip may take longer before the member goes on alone (``Fleet.join_s``).
        self.answered = False

    @property
    def available(self) -> bool:
        """No outage going on."""
        return self._down_since is None

    def admit(self) -> Pass:
        """Whether this call may ask Redis; a skip counts as a fallback."""
        with self._lock:
            self.calls += 1
            if self._down_since is None:
                return Pass.GO
            if self._trial_out or self._clock() < self._retry_at:
                self.fallbacks += 1
                return Pass.SKIP
            self._trial_out = True
            return Pass.TRIAL

    def succeeded(self, ticket: Pass) -> None:
        """Redis answered."""
        with self._lock:
            self.answered = True
            if ticket is Pass.TRIAL:
                self._trial_out = False
            if self._down_since is None:
                return
            down_s = self._clock() - self._down_since
            self._down_since = None
            self._backoff = self._initial
            self._trial_out = False
            self.rejoins += 1
            self.config_error = None
        logger.info("fleet %s: Redis answers again after %.1f s; rejoined", self.name, down_s)

    def failed(self, ticket: Pass, error: BaseException) -> None:
        """Redis failed or was too slow: start (or extend, after a trial) the outage."""
        wrong = config_error(error)
        with self._lock:
            self.fallbacks += 1
            self.config_error = wrong
            now = self._clock()
            if self._down_since is None:
                self._down_since = now
                self._backoff = self._initial
                self._retry_at = now + self._backoff
                self.outages += 1
                first = True
            else:
                first = False
                if ticket is Pass.TRIAL:
                    self._trial_out = False
                    self._backoff = min(self._backoff * 2, self._max)
                    self._retry_at = now + self._backoff
        if wrong is not None and (first or ticket is Pass.TRIAL):
            logger.warning(
                "fleet %s: %s; check the fleet's URL and Redis user. Using local limits, "
                "retrying in %.1f s",
                self.name,
                wrong,
                self._backoff,
            )
        elif first:
            logger.warning(
                "fleet %s: Redis unavailable (%s: %s); using local limits, retrying in %.1f s",
                self.name,
                type(error).__name__,
                error,
                self._initial,
            )

    def abandoned(self, ticket: Pass) -> None:
        """The call was cancelled before Redis answered: no verdict."""
        if ticket is Pass.TRIAL:
            with self._lock:
                self._trial_out = False

"""Transports: how a Gate reaches an upstream (the governed protocol; HTTP clients later)."""

from yieldgate.transports.governed import GovernedClient, GovernedStream

__all__ = ["GovernedClient", "GovernedStream"]

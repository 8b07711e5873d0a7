"""Transports: how a Gate reaches an upstream.

``GovernedClient`` speaks the governed protocol over TCP; ``http_client`` and
``gate_transport`` put a Gate under httpx and httpx2 clients, async and sync;
``openai_client``, ``anthropic_client`` and ``huggingface_clients`` put one
under the official openai, anthropic and huggingface_hub clients in one call.
"""

from yieldgate.transports._clients import anthropic_client, huggingface_clients, openai_client
from yieldgate.transports._hub_factories import HubClientsInUseError
from yieldgate.transports.governed import GovernedClient, GovernedStream
from yieldgate.transports.http import (
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    Flavor,
    gate_transport,
    http_client,
)

__all__ = [
    "DEADLINE_HEADER",
    "PRIORITY_HEADER",
    "Flavor",
    "GovernedClient",
    "GovernedStream",
    "HubClientsInUseError",
    "anthropic_client",
    "gate_transport",
    "http_client",
    "huggingface_clients",
    "openai_client",
]

"""The SDK's public import path: `from broker.sdk import Client` (code in broker.client.sdk)."""

from broker.client.sdk import FINAL, STOPPED, Client

__all__ = ["FINAL", "STOPPED", "Client"]

"""The SDK's public import path: `from broker.sdk import Client`.

`Client()` talks to the database of a broker home (embedded: one person, one machine) or,
when ONEPOOL_URL is set (or `server=` is given), to an `onepool server` over HTTP with the
token in ONEPOOL_TOKEN (or `token=`). Both have the same methods, results and errors.
"""

from __future__ import annotations

import os
from typing import Any

from broker.client.http import HttpClient
from broker.client.sdk import Client as EmbeddedClient
from broker.client.waits import FINAL, STOPPED

__all__ = ["FINAL", "STOPPED", "Client", "EmbeddedClient", "HttpClient"]


def Client(home: str | os.PathLike[str] | None = None, *, server: str | None = None,
           token: str | None = None, **embedded: Any) -> EmbeddedClient | HttpClient:
    """The embedded client of `home`, or the HTTP client of `server` / $ONEPOOL_URL."""
    url = server or os.environ.get("ONEPOOL_URL")
    if url:
        return HttpClient(url, token or os.environ.get("ONEPOOL_TOKEN"))
    return EmbeddedClient(home, **embedded)

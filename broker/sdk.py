"""The SDK's public import path: `from broker.sdk import Client`.

`Client()` talks to the database of a broker home (embedded: one person, one machine) or,
when ONEPOOL_URL is set (or `server=` is given), to an `onepool server` over HTTP with the
token in ONEPOOL_TOKEN (or `token=`). Both have the same methods, results and errors.

Over HTTP this module imports only the thin client (httpx, pydantic: `pip install onepool`);
the embedded client and its database layer (`pip install 'onepool[server]'`) are imported
only when a home is opened, and a missing server part raises ServerPartsMissing saying so.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from broker.client.http import HttpClient
from broker.client.waits import FINAL, STOPPED
from broker.errors import SERVER_MODULES, OnepoolError

if TYPE_CHECKING:
    from broker.client.sdk import Client as EmbeddedClient

__all__ = ["FINAL", "STOPPED", "Client", "EmbeddedClient", "HttpClient", "ServerPartsMissing",
           "embedded_client"]



class ServerPartsMissing(OnepoolError):
    """This install is the thin client: set ONEPOOL_URL (and ONEPOOL_TOKEN) to use a server,
    or `pip install 'onepool[server]'` for a home of your own."""


def embedded_client(home: str | os.PathLike[str] | None = None, **embedded: Any) -> EmbeddedClient:
    """The embedded client of `home` (its database on this machine). Raises ServerPartsMissing
    when the server parts are not installed here."""
    try:
        from broker.client.sdk import Client as Embedded
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in SERVER_MODULES:
            raise
        raise ServerPartsMissing(
            f"this needs onepool's server parts ({e.name} is not installed): run "
            "`pip install 'onepool[server]'`, or set ONEPOOL_URL (and ONEPOOL_TOKEN) to use an "
            "onepool server over HTTP") from None
    return Embedded(home, **embedded)


def Client(home: str | os.PathLike[str] | None = None, *, server: str | None = None,
           token: str | None = None, **embedded: Any) -> EmbeddedClient | HttpClient:
    """The embedded client of `home`, or the HTTP client of `server` / $ONEPOOL_URL."""
    url = server or os.environ.get("ONEPOOL_URL")
    if url:
        return HttpClient(url, token or os.environ.get("ONEPOOL_TOKEN"))
    return embedded_client(home, **embedded)


def __getattr__(name: str) -> Any:  # `from broker.sdk import EmbeddedClient`, imported on first use
    if name == "EmbeddedClient":
        from broker.client.sdk import Client as Embedded

        return Embedded
    raise AttributeError(name)

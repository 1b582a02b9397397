"""Several server URLs, one answering: `--server URL1,URL2` (the agent) and ONEPOOL_URL with
commas (the SDK and the CLI).

Every API process on one database can serve every request (they share the database; only
the leader of the lease acts, broker.control.lease), so following the leader when its
machine dies is failover: a request goes to the URL that answered last; when it cannot
connect there (refused, connect timeout, no route, no such name), it goes to the next URL in
turn, and the one that answers is kept for the next requests. Only a failure to connect
moves on: such a request never reached a server, so sending it again is safe whatever its
method. A request that failed after it was sent (the server died while answering) is the
caller's to retry, as with one URL. Imports only httpx: the thin client uses it.
"""

from __future__ import annotations

import logging
import threading

import httpx

log = logging.getLogger("onepool.failover")
CONNECT_TIMEOUT_S = 3.0  # a server that does not accept within this is taken as down: next URL


def split_urls(value: str) -> list[str]:
    """The URLs of `value` ("URL" or "URL1,URL2,..."), without trailing slashes. Raises
    ValueError naming what is wrong."""
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    if not urls:
        raise ValueError(f"server: no URL in {value!r} (expected URL or URL1,URL2,...)")
    for u in urls:
        if not u.startswith(("http://", "https://")):
            raise ValueError(f"server: {u!r} is not an http:// or https:// URL "
                             "(expected URL or URL1,URL2,...)")
    return urls


class FailoverTransport(httpx.BaseTransport):
    """An httpx transport over several base URLs (see the module). The client's base_url must
    be the first of `urls`; each request is moved to the URL in use (same path below it)."""

    def __init__(self, urls: list[str], inner: httpx.BaseTransport | None = None) -> None:
        if not urls:
            raise ValueError("server: no URL given (expected URL or URL1,URL2,...)")
        self.urls = [httpx.URL(u.rstrip("/")) for u in urls]
        self.inner = inner or httpx.HTTPTransport(retries=1)
        self.current = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        """The URL in use (the one that answered last)."""
        return str(self.urls[self.current])

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        first = self.current
        base = self.urls[0].raw_path.rstrip(b"/")
        path = request.url.raw_path  # with its query
        rel = path[len(base):] if path.startswith(base) else path
        error: httpx.TransportError | None = None
        for i in range(len(self.urls)):
            k = (first + i) % len(self.urls)
            target = self.urls[k]
            request.url = target.copy_with(raw_path=target.raw_path.rstrip(b"/") + rel)
            request.headers["Host"] = target.netloc.decode("ascii")
            try:
                response = self.inner.handle_request(request)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                error = e
                continue
            if k != first:
                with self._lock:
                    self.current = k
                log.warning("server %s cannot be reached (%s): using %s", self.urls[first], error, target)
            return response
        assert error is not None
        raise error

    def close(self) -> None:
        self.inner.close()


def make_client(server: str, timeout: float | httpx.Timeout, *, headers: dict[str, str] | None = None,
                transport: httpx.BaseTransport | None = None) -> httpx.Client:
    """An httpx client of `server` (one URL or several, comma-separated: see the module): its
    base_url is the first, connecting times out after CONNECT_TIMEOUT_S (then the next URL),
    requests go through the failover transport over `transport` (default: httpx's). Raises
    ValueError for a malformed `server`."""
    urls = split_urls(server)
    t = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S)
    return httpx.Client(base_url=urls[0], timeout=t, headers=headers,
                        transport=FailoverTransport(urls, transport))

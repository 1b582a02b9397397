"""What the server checks before doing any work for a request (an ASGI middleware, outermost):

1. The sending address's failed authentications (answers 401) are counted in a token bucket
   (`broker.api.auth_failure_burst` at once, then `auth_failures_per_s`). An address whose
   bucket is empty gets 429 with Retry-After, before its body is read, routed or its token
   checked: a flood of bad tokens costs the server a dictionary lookup per request. Other
   addresses are not affected, and neither are credentials that passed authentication
   lately (their Authorization header's SHA-256 is remembered, in memory): an agent or a
   client behind the same address as the flood (a NAT, a proxy, a hostile job on the agent's
   node) keeps being served. Those requests still go through the full token check, so a
   revocation is seen at once (and forgets the credential here).
2. The body must fit the route's limit (`broker.api.max_log_upload_bytes` for agents' log
   uploads, `max_body_bytes` for the rest): a larger Content-Length is answered 413 before a
   byte is read; a body without one (chunked) is read here, counting, and answered 413 the
   moment it goes past the limit. Only then do parsing and the token check run.

Both answers are the API's JSON errors (broker.api.errors), so the HTTP client raises
TooManyRequests or TooLarge with the same message. Runs on the event loop only (no locks); its
counts live in this process (several API processes count apart, each with the same limits).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.api.errors import body
from broker.clock import Clock
from broker.errors import OnepoolError, TooLarge, TooManyRequests
from broker.spec_broker import ApiSettings

LOG_UPLOAD_PATH = "/v1/agent/logs"
# code snapshots (broker.api.routes_code): with a Content-Length, up to max_code_upload_bytes,
# read by the route after the token check; a chunked one is buffered here, so max_body_bytes
CODE_UPLOAD_PREFIX = "/v1/code/"
MAX_SOURCES = 50_000  # addresses remembered (least recently failed forgotten first)
MAX_GOOD = 10_000  # credentials remembered as good (least recently seen forgotten first)
AUTH_OK = "onepool.auth_ok"  # set True in a request's scope by whoever verified its credential


def authenticated(scope: Scope) -> None:
    """Mark the request whose ASGI `scope` this is as carrying a credential that passed (the
    routes call it once the token or node credential is verified)."""
    scope[AUTH_OK] = True


class FailureLimiter:
    """Per-address token buckets of failed authentications. Only addresses that failed are
    remembered, at most `max_sources` of them."""

    def __init__(self, clock: Clock, max_sources: int = MAX_SOURCES) -> None:
        self._clock, self._max = clock, max_sources
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # (tokens, at)

    def _level(self, source: str, limits: ApiSettings) -> float | None:
        got = self._buckets.get(source)
        if got is None:
            return None
        tokens, at = got
        return min(float(limits.auth_failure_burst),
                   tokens + (self._clock.now() - at) * limits.auth_failures_per_s)

    def retry_after(self, source: str, limits: ApiSettings) -> int | None:
        """Seconds `source` must wait before it is served again, or None if it may be now."""
        level = self._level(source, limits)
        if level is None or level >= 1.0:
            return None
        return max(1, math.ceil((1.0 - level) / limits.auth_failures_per_s))

    def failed(self, source: str, limits: ApiSettings) -> None:
        """Count one failed authentication from `source`. The bucket may go below zero (down to
        minus the burst): requests let in together before their failures were counted (one per
        open connection) are paid for by waiting longer, so concurrency buys no extra tries."""
        level = self._level(source, limits)
        burst = float(limits.auth_failure_burst)
        start = burst if level is None else level
        self._buckets[source] = (max(-burst, start - 1.0), self._clock.now())
        self._buckets.move_to_end(source)
        while len(self._buckets) > self._max:
            self._buckets.popitem(last=False)


class GoodCredentials:
    """SHA-256 digests of Authorization headers that passed authentication lately."""

    def __init__(self, capacity: int = MAX_GOOD) -> None:
        self._seen: OrderedDict[bytes, None] = OrderedDict()
        self._capacity = capacity

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._seen

    def add(self, digest: bytes) -> None:
        self._seen[digest] = None
        self._seen.move_to_end(digest)
        while len(self._seen) > self._capacity:
            self._seen.popitem(last=False)

    def discard(self, digest: bytes) -> None:
        self._seen.pop(digest, None)


class Guard:
    """The ASGI middleware (see the module's docstring). `limits` returns the current
    ApiSettings without blocking (broker.api.context.ApiContext.limits)."""

    def __init__(self, app: ASGIApp, limits: Callable[[], ApiSettings], clock: Clock) -> None:
        self.app, self.limits = app, limits
        self.failures = FailureLimiter(clock)
        self.good = GoodCredentials()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits = self.limits()
        client = scope.get("client")
        source = str(client[0]) if client else "unknown"
        wait = self.failures.retry_after(source, limits)
        declared = _content_length(scope)
        has_body = bool(declared) or _chunked(scope)
        auth = _header(scope, b"authorization")
        digest = hashlib.sha256(auth).digest() if auth else None
        if wait is not None and (digest is None or digest not in self.good):
            await _refuse(send, 429, has_body, TooManyRequests(
                f"too many failed authentications from {source}: retry in {wait} s (check the "
                f"token; the server allows {limits.auth_failure_burst} failures at once, then "
                f"{limits.auth_failures_per_s:g} a second: broker.api.auth_failure_burst, "
                f"auth_failures_per_s)", retry_after_s=wait), {"retry-after": str(wait)})
            return
        is_log = scope["path"] == LOG_UPLOAD_PATH
        cap, setting = ((limits.max_log_upload_bytes, "max_log_upload_bytes") if is_log
                        else (limits.max_code_upload_bytes, "max_code_upload_bytes")
                        if scope["path"].startswith(CODE_UPLOAD_PREFIX) and declared is not None
                        else (limits.max_body_bytes, "max_body_bytes"))
        if declared is not None and declared > cap:
            await _refuse(send, 413, True, _too_large(scope, cap, setting))
            return
        if declared is None and _chunked(scope):
            buffered = await _read_at_most(receive, cap)
            if buffered is None:
                await _refuse(send, 413, True, _too_large(scope, cap, setting))
                return
            receive = _replay(buffered, receive)

        async def watch(message: Message) -> None:
            if message["type"] == "http.response.start":
                if message["status"] == 401:
                    self.failures.failed(source, limits)
                    if digest is not None:
                        self.good.discard(digest)
                elif digest is not None and scope.get(AUTH_OK):
                    self.good.add(digest)
            await send(message)

        await self.app(scope, receive, watch)


def _too_large(scope: Scope, cap: int, setting: str) -> TooLarge:
    return TooLarge(f"request body larger than {cap} bytes, the limit for {scope['method']} "
                    f"{scope['path']} (setting broker.api.{setting})")


def _header(scope: Scope, name: bytes) -> bytes | None:
    for k, v in scope.get("headers", ()):
        if k.lower() == name:
            return bytes(v)
    return None


def _content_length(scope: Scope) -> int | None:
    raw = _header(scope, b"content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:  # the HTTP server refuses such requests before they get here
        return None


def _chunked(scope: Scope) -> bool:
    return b"chunked" in (_header(scope, b"transfer-encoding") or b"").lower()


async def _read_at_most(receive: Receive, cap: int) -> bytes | None:
    """The whole body, or None as soon as it passes `cap` bytes (the rest is not read)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":  # the client went away
            return b"".join(parts)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > cap:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _replay(data: bytes, receive: Receive) -> Receive:
    sent = False

    async def again() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()  # after the body: disconnects

    return again


async def _refuse(send: Send, status: int, close: bool, error: OnepoolError,
                  headers: dict[str, str] | None = None) -> None:
    """Answer `error` as the API's JSON error; with `close`, close the connection (the
    request's body is left unread)."""
    payload = json.dumps(body(error)).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    if close:
        raw.append((b"connection", b"close"))
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})

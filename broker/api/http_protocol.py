"""The server's HTTP/1.1 connections: uvicorn's h11 protocol with a deadline for each
request's head (issue 24, verification).

uvicorn closes a keep-alive connection that stays silent after a response, but a connection
that never completes a request line and headers (silent from the start, or sending a byte now
and then) stays open without end: each holds a file descriptor, so about a thousand of them
(the usual limit) from one unauthenticated address leave the server unable to accept the
agents' syncs or to open its database, and running work is fenced. Here a connection gets
`HEAD_TIMEOUT_S` from when it opens, or from the end of its previous response, to deliver a
complete request head, or it is closed; then `BODY_TIMEOUT_S` for its body (the guard,
broker.api.guard, bounds its size; this, its duration: a body sent a byte at a time holds
a descriptor just the same). 60 s allows a 3 MiB log upload at 50 KB/s.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0


class HeadDeadlineProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request head is not complete within
    `head_timeout_s`, or whose body is not complete `body_timeout_s` after its head (class
    attributes; tests lower them)."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    _timer: asyncio.TimerHandle | None = None
    _waiting_for: object = None  # the peer state the timer is for: h11.IDLE or h11.SEND_BODY

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(h11.IDLE, self.head_timeout_s)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._waiting_for is not h11.SEND_BODY:  # the head is complete: now the body
                self._arm(h11.SEND_BODY, self.body_timeout_s)
        elif state is not h11.IDLE:  # the request is complete (or the peer is done)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm(h11.IDLE, self.head_timeout_s)  # the next request's head: the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, waiting_for: object, after_s: float) -> None:
        self._disarm()
        self._waiting_for = waiting_for
        self._timer = self.loop.call_later(after_s, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._waiting_for = None, None

    def _expired(self) -> None:
        waiting_for, self._timer, self._waiting_for = self._waiting_for, None, None
        if self.conn.their_state is waiting_for and not self.transport.is_closing():
            self.transport.close()

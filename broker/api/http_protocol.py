"""The server's HTTP/1.1 connections: uvicorn's h11 protocol with a deadline for each
request's head (issue 24, verification).

uvicorn closes a keep-alive connection that stays silent after a response, but a connection
that never completes a request line and headers (silent from the start, or sending a byte now
and then) stays open without end: each holds a file descriptor, so about a thousand of them
(the usual limit) from one unauthenticated address leave the server unable to accept the
agents' syncs or to open its database, and running work is fenced. Here a connection gets
`HEAD_TIMEOUT_S` from when it opens, or from the end of its previous response, to deliver a
complete request head, or it is closed. A request's body is then bounded by the guard
(broker.api.guard); a slow one holds a coroutine, not a thread.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0


class HeadDeadlineProtocol(H11Protocol):
    """H11Protocol that closes a connection whose request head is not complete within
    `head_timeout_s` (class attribute; tests lower it)."""

    head_timeout_s: float = HEAD_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the head is complete (or the peer is done)
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()  # the next request's head has the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_expired)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_expired(self) -> None:
        self._head_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()

"""The load balancer in front of the chaos suite's `onepool server` processes.

In production an HA pair (two `onepool server` on one database, infra/README.md) sits behind
one address that the agents know (`broker.server_url`): a load balancer or a floating IP
that sends each connection to a server passing its health check. Here that is a TCP
forwarder on 127.0.0.1: each new connection goes to one of the live backends the driver
declares (`set_backends`), tried in turn from a rotating start; a backend that refuses the
connection is skipped. Connections already open stay with their backend until it closes
them or dies (an agent's long poll then fails and it calls again, through here, to another
server), as with a real TCP load balancer.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading


class Balancer:
    """Forwards connections to `url` to the backend ports given by `set_backends`."""

    def __init__(self) -> None:
        self._backends: list[int] = []
        self._lock = threading.Lock()
        self._turn = itertools.count()
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.port = self._sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="balancer", daemon=True)
        self._thread.start()

    def set_backends(self, ports: list[int]) -> None:
        """The servers that pass the health check now (the driver knows which live)."""
        with self._lock:
            self._backends = list(ports)

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=5)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = self._connect()
        if upstream is None:  # no server is up: the caller sees a reset and retries later
            client.close()
            return
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def _connect(self) -> socket.socket | None:
        with self._lock:
            ports = list(self._backends)
        if not ports:
            return None
        start = next(self._turn) % len(ports)
        for port in ports[start:] + ports[:start]:
            try:
                return socket.create_connection(("127.0.0.1", port), timeout=2.0)
            except OSError:
                continue
        return None


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy bytes until either side closes; then close both (the other pipe ends too)."""
    src.settimeout(None)
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

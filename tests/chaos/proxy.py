"""A fault-injecting HTTP proxy in front of moto's server: the brokers' EC2 and SQS calls
go through it (the pools' endpoint_url), so faults reach the real botocore code paths.

Faults (armed by the chaos driver, counted as injected):
- capacity: RunInstances of an instance type in `capacity_types` answers
  InsufficientInstanceCapacity (the cheapest pool is out of stock);
- throttle: the next N calls answer 503 RequestLimitExceeded (a throttling burst);
- error5xx: the next N calls answer 500 InternalError;
- timeout: the next N calls stall past the client's read timeout, THEN reach moto (the
  cloud acted although the caller gave up: a launch retried with the same token);
- hide: the next N broker listings (DescribeInstances filtered by the broker tag) miss one
  live instance.
"""

from __future__ import annotations

import http.client
import random
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15/"
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


@dataclass
class Faults:
    capacity_types: set[str] = field(default_factory=set)
    throttle: int = 0
    error5xx: int = 0
    timeout: int = 0
    hide: int = 0
    stall_s: float = 2.5
    injected: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take(self, kind: str) -> bool:
        """Use one of the armed faults of `kind` (True) or none is armed (False)."""
        with self.lock:
            left = getattr(self, kind)
            if left <= 0:
                return False
            setattr(self, kind, left - 1)
            self.injected[kind] += 1
            return True

    def clear(self) -> None:
        with self.lock:
            self.capacity_types.clear()
            self.throttle = self.error5xx = self.timeout = self.hide = 0


class FaultProxy:
    """Forwards to `upstream` (host, port); `url` is where clients point."""

    def __init__(self, upstream: tuple[str, int], faults: Faults) -> None:
        self.upstream, self.faults = upstream, faults
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:  # EC2 (query protocol) and SQS (JSON protocol)
                proxy.handle(self)

            def do_GET(self) -> None:
                proxy.handle(self)

        class Server(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out and left, by design of the timeout fault

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def handle(self, req: BaseHTTPRequestHandler) -> None:
        body = req.rfile.read(int(req.headers.get("Content-Length") or 0))
        sqs = (req.headers.get("X-Amz-Target") or "").startswith("AmazonSQS")
        form = {} if sqs else {k: v[0] for k, v in parse_qs(body.decode(errors="replace")).items()}
        action = form.get("Action", req.headers.get("X-Amz-Target", ""))
        f = self.faults
        if action == "RunInstances" and form.get("InstanceType") in f.capacity_types:
            with f.lock:
                f.injected["capacity"] += 1
            return self._error(req, sqs, 500, "InsufficientInstanceCapacity",
                               "simulated: no capacity for this instance type")
        if f.take("throttle"):
            return self._error(req, sqs, 503, "RequestLimitExceeded" if not sqs else "ThrottlingException",
                               "simulated throttling burst")
        if f.take("error5xx"):
            return self._error(req, sqs, 500, "InternalError", "simulated server error")
        if f.take("timeout"):
            time.sleep(f.stall_s)  # the client has given up; the cloud still acts below
        status, headers, data = self._forward(req, body)
        if (action == "DescribeInstances" and "tag:onepool-broker" in form.values()
                and status == 200 and f.take("hide")):
            data = _hide_one(data)
        try:
            req.send_response(status)
            for k, v in headers:
                if k.lower() not in HOP:
                    req.send_header(k, v)
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left

    def _forward(self, req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in ("host", "connection")}
            conn.request(req.command, req.path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheaders(), resp.read()
        finally:
            conn.close()

    @staticmethod
    def _error(req: BaseHTTPRequestHandler, sqs: bool, status: int, code: str, msg: str) -> None:
        if sqs:
            data = f'{{"__type": "com.amazonaws.sqs#{code}", "message": "{msg}"}}'.encode()
            ctype = "application/x-amz-json-1.0"
        else:
            data = (f'<?xml version="1.0" encoding="UTF-8"?><Response><Errors><Error><Code>{code}'
                    f"</Code><Message>{msg}</Message></Error></Errors><RequestID>{uuid.uuid4()}"
                    "</RequestID></Response>").encode()
            ctype = "text/xml"
        try:
            req.send_response(status)
            req.send_header("Content-Type", ctype)
            req.send_header("Content-Length", str(len(data)))
            req.end_headers()
            req.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


def _hide_one(data: bytes) -> bytes:
    """The DescribeInstances response without one of its reservations (one instance each)."""
    ET.register_namespace("", EC2_NS)
    try:
        root = ET.fromstring(data)
    except ET.ParseError:
        return data
    rset = root.find(f"{{{EC2_NS}}}reservationSet")
    if rset is None or not list(rset):
        return data
    rset.remove(random.choice(list(rset)))
    return ET.tostring(root, xml_declaration=True, encoding="UTF-8")

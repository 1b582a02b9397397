"""A fake of the Compute Engine REST API on 127.0.0.1 (http.server), enough for the real
google-cloud-compute client: instances insert/get/delete/aggregatedList, zone operations
(answered DONE at once), request_id idempotency, injected failures."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from tests.providers.harness import Harness

BASE = r"/compute/v1/projects/(?P<p>[^/]+)"


class State:
    def __init__(self) -> None:
        self.instances: dict[str, dict[str, Any]] = {}
        self.ops: dict[str, dict[str, Any]] = {}
        self.by_request: dict[str, dict[str, Any]] = {}
        self.fail: list[tuple[int, str]] = []  # (HTTP status or 0 for an operation error, code)
        self.ids = itertools.count(1000)
        self.lock = threading.Lock()

    def op(self, kind: str, zone: str, target: str, error: str | None = None) -> dict[str, Any]:
        n = f"operation-{next(self.ids)}"
        op: dict[str, Any] = {"kind": "compute#operation", "name": n, "id": str(next(self.ids)),
                              "status": "DONE", "operationType": kind, "zone": f"zones/{zone}",
                              "targetLink": f"projects/p/zones/{zone}/instances/{target}"}
        if error:
            op["error"] = {"errors": [{"code": error, "message": f"simulated {error}"}]}
        self.ops[n] = op
        return op


class Handler(BaseHTTPRequestHandler):
    state: State

    def log_message(self, *a: Any) -> None:
        pass

    def _send(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, code: int, msg: str) -> None:
        self._send(code, {"error": {"code": code, "message": msg, "errors": [{"message": msg}]}})

    def _route(self, method: str) -> None:
        u = urlparse(self.path)
        q = parse_qs(u.query)
        st = self.state
        with st.lock:
            if (m := re.fullmatch(BASE + r"/zones/(?P<z>[^/]+)/instances", u.path)) and method == "POST":
                return self._insert(m["z"], q.get("requestId", [""])[0])
            if m := re.fullmatch(BASE + r"/zones/(?P<z>[^/]+)/instances/(?P<n>[^/]+)", u.path):
                inst = st.instances.get(m["n"])
                if inst is None:
                    return self._error(404, f"The resource 'instances/{m['n']}' was not found")
                if method == "GET":
                    return self._send(200, inst)
                inst["status"] = "TERMINATED"
                return self._send(200, st.op("delete", m["z"], m["n"]))
            if re.fullmatch(BASE + r"/aggregated/instances", u.path):
                zones: dict[str, Any] = {}
                for i in st.instances.values():
                    zones.setdefault(i["zone"], {"instances": []})["instances"].append(i)
                return self._send(200, {"items": zones})
            if m := re.fullmatch(BASE + r"/zones/(?P<z>[^/]+)/operations", u.path):
                kind = "compute.instances.preempted"
                items = [o for o in st.ops.values() if kind not in q.get("filter", [""])[0]
                         or o["operationType"] == kind]
                return self._send(200, {"items": items})
            if m := re.fullmatch(BASE + r"/zones/(?P<z>[^/]+)/operations/(?P<o>[^/]+)(/wait)?", u.path):
                return self._send(200, st.ops[m["o"]])
        self._error(404, f"fake: no route for {method} {u.path}")

    def _insert(self, zone: str, rid: str) -> None:
        st = self.state
        if st.fail:
            status, code = st.fail.pop(0)
            if status:
                return self._error(status, f"{code}: simulated")
            return self._send(200, st.op("insert", zone, "x", error=code))
        if rid in st.by_request:
            return self._send(200, st.by_request[rid])
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if body["name"] in st.instances and st.instances[body["name"]]["status"] != "TERMINATED":
            return self._error(409, f"The resource 'instances/{body['name']}' already exists")
        st.instances[body["name"]] = {**body, "id": str(next(st.ids)), "status": "RUNNING",
                                      "zone": f"zones/{zone}"}
        st.by_request[rid] = st.op("insert", zone, body["name"])
        self._send(200, st.by_request[rid])

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")


@pytest.fixture
def gcp_fake() -> Iterator[tuple[str, State]]:
    """(endpoint URL, state) of a fresh fake."""
    state = State()
    handler = type("H", (Handler,), {"state": state})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", state
    finally:
        srv.shutdown()
        srv.server_close()


GCP_ERRORS = {"capacity": (0, "ZONE_RESOURCE_POOL_EXHAUSTED"), "quota": (403, "QUOTA_EXCEEDED"),
              "throttle": (429, "rateLimitExceeded"), "fatal": (400, "invalid machine type")}


def gcp_harness(fake: tuple[str, State]) -> Harness:
    from providers.gcp import GcpProvider

    url, state = fake
    prov = GcpProvider.from_config("p", "us-central1-a", endpoint_url=url)

    def fail(kind: str, times: int) -> None:
        state.fail.extend([GCP_ERRORS[kind]] * times)

    return Harness("gcp", prov, fail, frozenset(GCP_ERRORS), instance_type="a2-highgpu-1g")

"""A fake of the Compute Engine REST API on 127.0.0.1 (http.server), enough for the real
google-cloud-compute client: instances insert/get/delete/aggregatedList, machine and
accelerator types per zone, zone operations, request_id idempotency, preemptions, injected
failures.

Operations behave as GCP's do: an insert or delete answers with an operation still RUNNING
(the instance PROVISIONING, or STOPPING), which becomes DONE after `op_polls` further GETs or
waits of it; only then does the instance run (or vanish, or the error show)."""

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
ZONE = BASE + r"/zones/(?P<z>[^/]+)"
# machine type -> accelerators it carries ([] for general-purpose types)
MACHINE_TYPES: dict[str, list[dict[str, Any]]] = {
    "n1-standard-8": [], "n1-standard-16": [],
    "a2-highgpu-1g": [{"guestAcceleratorType": "nvidia-tesla-a100", "guestAcceleratorCount": 1}],
    "g2-standard-8": [{"guestAcceleratorType": "nvidia-l4", "guestAcceleratorCount": 1}],
}
# zone -> accelerator types offered there
ACCELERATORS = {"us-central1-a": ["nvidia-tesla-t4", "nvidia-tesla-a100", "nvidia-l4"],
                "us-central1-b": ["nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4"],
                "us-central1-c": ["nvidia-tesla-a100"]}


class State:
    def __init__(self) -> None:
        self.instances: dict[tuple[str, str], dict[str, Any]] = {}  # (zone, name) -> resource
        self.ops: dict[str, dict[str, Any]] = {}
        self.pending: dict[str, tuple[int, Any]] = {}  # op name -> (polls left, what DONE does)
        self.by_request: dict[str, dict[str, Any]] = {}
        self.inserts: list[dict[str, Any]] = []  # every insert body, in order
        self.fail: list[tuple[int, str]] = []  # (HTTP status or 0 for an operation error, code)
        self.fail_zones: dict[str, str] = {}  # zone -> operation error code for every insert there
        self.op_polls = 2
        self.polled = 0  # operation GETs and waits answered
        self.ids = itertools.count(1000)
        self.clock = itertools.count(0)
        self.lock = threading.Lock()

    def op(self, kind: str, zone: str, target: str, done: Any = None, error: str | None = None,
           polls: int | None = None) -> dict[str, Any]:
        n = f"operation-{next(self.ids)}"
        t = next(self.clock)
        op: dict[str, Any] = {"kind": "compute#operation", "name": n, "id": str(next(self.ids)),
                              "status": "RUNNING", "operationType": kind, "zone": f"zones/{zone}",
                              "creationTimestamp": f"2026-12-03T10:{t // 60:02d}:{t % 60:02d}.000-08:00",
                              "targetLink": f"projects/p/zones/{zone}/instances/{target}"}
        self.ops[n] = op
        left = self.op_polls if polls is None else polls
        self.pending[n] = (left, lambda: self._finish(op, done, error))
        if left == 0:
            self._advance(n)
        return op

    def _finish(self, op: dict[str, Any], done: Any, error: str | None) -> None:
        op["status"] = "DONE"
        if error:
            op["error"] = {"errors": [{"code": error, "message": f"simulated {error}"}]}
        if done is not None:
            done(error)

    def _advance(self, name: str) -> None:
        if name not in self.pending:
            return
        left, finish = self.pending[name]
        if left <= 0:
            del self.pending[name]
            finish()
        else:
            self.pending[name] = (left - 1, finish)

    def preempt(self, zone: str, name: str) -> None:
        """GCP reclaims a SPOT VM: a `compute.instances.preempted` operation; the VM is
        TERMINATED (its termination action DELETE then removes it)."""
        with self.lock:
            self.instances[(zone, name)]["status"] = "TERMINATED"
            self.op("compute.instances.preempted", zone, name, polls=0)


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
            if (m := re.fullmatch(ZONE + r"/instances", u.path)) and method == "POST":
                return self._insert(m["z"], q.get("requestId", [""])[0])
            if m := re.fullmatch(ZONE + r"/instances/(?P<n>[^/]+)", u.path):
                inst = st.instances.get((m["z"], m["n"]))
                if inst is None:
                    return self._error(404, f"The resource 'instances/{m['n']}' was not found")
                if method == "GET":
                    return self._send(200, inst)
                return self._delete(m["z"], m["n"], inst)
            if re.fullmatch(BASE + r"/aggregated/instances", u.path):
                return self._send(200, {"items": self._aggregated(q.get("filter", [""])[0])})
            if m := re.fullmatch(ZONE + r"/operations", u.path):
                return self._send(200, {"items": self._operations(m["z"], q)})
            if m := re.fullmatch(ZONE + r"/operations/(?P<o>[^/]+?)(?P<wait>/wait)?", u.path):
                st.polled += 1
                st._advance(m["o"])
                return self._send(200, st.ops[m["o"]])
            if m := re.fullmatch(ZONE + r"/machineTypes(/(?P<t>[^/]+))?", u.path):
                return self._machine_types(m["z"], m["t"])
            if m := re.fullmatch(ZONE + r"/acceleratorTypes/(?P<a>[^/]+)", u.path):
                if m["a"] not in ACCELERATORS.get(m["z"], []):
                    return self._error(404, f"The resource 'acceleratorTypes/{m['a']}' was not found")
                return self._send(200, _accelerator(m["z"], m["a"]))
            if re.fullmatch(BASE + r"/aggregated/acceleratorTypes", u.path):
                return self._send(200, {"items": {f"zones/{z}": {"acceleratorTypes": [
                    _accelerator(z, a) for a in names]} for z, names in ACCELERATORS.items()}})
        self._error(404, f"fake: no route for {method} {u.path}")

    def _insert(self, zone: str, rid: str) -> None:
        st = self.state
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if rid in st.by_request:
            return self._send(200, st.by_request[rid])
        error = st.fail_zones.get(zone)
        if st.fail and error is None:
            status, code = st.fail.pop(0)
            if status:
                return self._error(status, f"{code}: simulated")
            error = code
        name = body["name"]
        live = st.instances.get((zone, name))
        if live is not None and live["status"] != "TERMINATED":
            return self._error(409, f"The resource 'instances/{name}' already exists")
        st.inserts.append({**body, "zone": zone})
        st.instances[(zone, name)] = {**body, "id": str(next(st.ids)), "status": "PROVISIONING",
                                      "zone": f"projects/p/zones/{zone}"}

        def done(err: str | None) -> None:
            if err:
                del st.instances[(zone, name)]
            else:
                st.instances[(zone, name)]["status"] = "RUNNING"

        st.by_request[rid] = st.op("insert", zone, name, done, error)
        self._send(200, st.by_request[rid])

    def _delete(self, zone: str, name: str, inst: dict[str, Any]) -> None:
        st = self.state
        inst["status"] = "STOPPING"
        self._send(200, st.op("delete", zone, name, lambda _err: st.instances.pop((zone, name), None)))

    def _aggregated(self, filt: str) -> dict[str, Any]:
        want = re.fullmatch(r"labels\.(?P<k>[\w-]+)=(?P<v>[\w-]*)", filt)
        zones: dict[str, Any] = {}
        for (zone, _), i in self.state.instances.items():
            if want and i.get("labels", {}).get(want["k"]) != want["v"]:
                continue
            zones.setdefault(f"zones/{zone}", {"instances": []})["instances"].append(i)
        return zones

    def _operations(self, zone: str, q: dict[str, list[str]]) -> list[dict[str, Any]]:
        kind = re.search(r'operationType="([^"]+)"', q.get("filter", [""])[0])
        ops = [o for o in self.state.ops.values() if o["zone"] == f"zones/{zone}"
               and (kind is None or o["operationType"] == kind[1])]
        desc = q.get("orderBy", [""])[0] == "creationTimestamp desc"
        return sorted(ops, key=lambda o: o["creationTimestamp"], reverse=desc)

    def _machine_types(self, zone: str, name: str | None) -> None:
        if name is None:
            return self._send(200, {"items": [_machine_type(zone, n) for n in MACHINE_TYPES]})
        if name not in MACHINE_TYPES:
            return self._error(404, f"The resource 'machineTypes/{name}' was not found")
        return self._send(200, _machine_type(zone, name))

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")


def _machine_type(zone: str, name: str) -> dict[str, Any]:
    return {"name": name, "zone": zone, "accelerators": MACHINE_TYPES[name]}


def _accelerator(zone: str, name: str) -> dict[str, Any]:
    return {"name": name, "zone": f"projects/p/zones/{zone}", "maximumCardsPerInstance": 8}


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


def gcp_provider(url: str, zones: list[str] | None = None, gpu_type: str = "A100", gpus: int = 1,
                 **options: Any) -> Any:
    """A GcpProvider on the fake, built as the registry builds one."""
    from providers.gcp import GcpProvider
    from providers.options import GcpOptions

    opts = GcpOptions.model_validate({"project": "p", **options})
    return GcpProvider.from_config(opts, zones or ["us-central1-a"], endpoint_url=url,
                                   gpu_type=gpu_type, gpus=gpus)


def gcp_harness(fake: tuple[str, State]) -> Harness:
    url, state = fake
    prov = gcp_provider(url)

    def fail(kind: str, times: int) -> None:
        state.fail.extend([GCP_ERRORS[kind]] * times)

    def script(iid: str) -> str | None:
        zone, name = iid.split("/")
        items = state.instances[(zone, name)]["metadata"]["items"]
        return next(i["value"] for i in items if i["key"] == "startup-script")

    def market(iid: str) -> str:
        zone, name = iid.split("/")
        spot = state.instances[(zone, name)]["scheduling"].get("provisioningModel") == "SPOT"
        return "spot" if spot else "on_demand"

    return Harness("gcp", prov, fail, frozenset(GCP_ERRORS), instance_type="a2-highgpu-1g",
                   boot_script=script, market_of=market)

"""Attacks a hostile job would try next (issue 24, verification), each against real files and
real processes, each a hole that was open in the merged code.

The checkpoint cases: a job on a local pool owns its team's folder of a file store, and the
leader reads what it writes there (its progress and done markers while it runs, its manifests
and files when it resumes). Each case runs the broker's read in a child process with a
deadline, so a read that would block (a FIFO) or read without end (a sparse file) fails the
test instead of hanging it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from broker.checkpoint.checkpoints import ATTEMPTS_DIR, CheckpointStore, job_prefix

DEADLINE_S = 15.0
READ = """
import json, sys
from broker.checkpoint.checkpoints import CheckpointStore
from broker.checkpoint.transfer import SourceDamaged, copy_checkpoint
st = CheckpointStore(sys.argv[1])
what = sys.argv[2]
if what == "restore":
    m, skipped = st.latest_valid()
    print(json.dumps({"step": m and m.step, "skipped": skipped}))
elif what == "copy":  # step 2 streamed to another filesystem, as if it had verified before
    try:
        copy_checkpoint(st, st.manifest(2), CheckpointStore(sys.argv[3]), now=0.0, tries=1)
        print(json.dumps({"copy": "copied"}))
    except SourceDamaged as e:
        print(json.dumps({"copy": "source damaged"}))
elif what == "progress":
    print(json.dumps({"progress": st.progress(1)}))
elif what == "done":
    print(json.dumps({"done": st.all_done(1, 1)}))
"""


def good_step(st: CheckpointStore) -> None:
    st.write(1, {"weights": b"step one"}, now=0.0)


def manifest_of_2(st: CheckpointStore) -> Path:
    """Step 2's folder holding a copy of step 1's manifest (step 2) and returns the folder."""
    d = Path(st.step_path(2))
    d.mkdir(parents=True)
    m = json.loads(Path(st.step_path(1, "manifest.json")).read_text())
    m["step"] = 2
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def fifo_manifest(st: CheckpointStore) -> None:
    d = Path(st.step_path(2))
    d.mkdir(parents=True)
    os.mkfifo(d / "manifest.json")


def fifo_file(st: CheckpointStore) -> None:
    os.mkfifo(manifest_of_2(st) / "weights")


def sparse_file(st: CheckpointStore) -> None:
    """A file of 4 TiB (sparse: no disk) where the manifest says 8 bytes."""
    with open(manifest_of_2(st) / "weights", "wb") as f:
        f.truncate(4 << 40)


def fifo_progress(st: CheckpointStore) -> None:
    d = Path(st.root, ATTEMPTS_DIR)
    d.mkdir(parents=True, exist_ok=True)
    os.mkfifo(d / "attempt-00001.json")


def fifo_done(st: CheckpointStore) -> None:
    d = Path(st.root, ATTEMPTS_DIR)
    d.mkdir(parents=True, exist_ok=True)
    os.mkfifo(d / "attempt-00001-done-rank-00000.json")


@dataclass
class Case:
    plant: Callable[[CheckpointStore], None]
    read: str  # what the broker does (READ above)
    want: dict[str, object]  # its answer (a subset)


CASES = {
    "fifo_manifest": Case(fifo_manifest, "restore", {"step": 1}),
    "fifo_file": Case(fifo_file, "restore", {"step": 1}),
    "fifo_file_streamed": Case(fifo_file, "copy", {"copy": "source damaged"}),
    "sparse_file_larger_than_declared": Case(sparse_file, "restore", {"step": 1}),
    "fifo_progress_marker": Case(fifo_progress, "progress", {"progress": None}),
    "fifo_done_marker": Case(fifo_done, "done", {"done": True}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_job_written_special_file_never_stalls_the_broker(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    prefix = job_prefix(str(tmp_path / "store"), "nlp", "exp", 7)
    st = CheckpointStore(prefix)
    good_step(st)
    case.plant(st)
    args = [sys.executable, "-c", READ, prefix, case.read, "memory://attacks/nlp/exp/7"]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=DEADLINE_S,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: the broker's {case.read} did not return within {DEADLINE_S:g} s")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert {k: got[k] for k in case.want} == case.want, got
    if case.read == "restore":
        assert any("step 2 damaged" in s for s in got["skipped"]), got


# -- slow HTTP clients -------------------------------------------------------------------------

async def _tiny_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):  # the whole body first, as the API's routes do
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.contextmanager
def running(app: Any) -> Iterator[int]:
    """The server's own uvicorn configuration (broker.api.server.uvicorn_config) around `app`,
    on a free port of 127.0.0.1, in a thread; yields the port."""
    from broker.api.server import uvicorn_config

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(app, "127.0.0.1", port))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    try:
        while not server.started:
            assert t.is_alive(), "the server did not start"
            time.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        t.join(timeout=10)


@pytest.fixture
def http_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """`running(_tiny_app)` with a head deadline of 0.5 s, a body deadline of 1 s."""
    from broker.api import http_protocol

    monkeypatch.setattr(http_protocol.HeadDeadlineProtocol, "head_timeout_s", 0.5)
    monkeypatch.setattr(http_protocol.HeadDeadlineProtocol, "body_timeout_s", 1.0)
    with running(_tiny_app) as port:
        yield port


def _closed_by_server(sock: socket.socket, dribble: bytes = b"", within_s: float = 4.0) -> bool:
    """Whether the server closes `sock` within `within_s` (sending `dribble` a byte at a time,
    every 0.1 s, meanwhile)."""
    end = time.monotonic() + within_s
    sock.settimeout(0.1)
    sent = 0
    while time.monotonic() < end:
        try:
            if sock.recv(4096) == b"":
                return True
        except TimeoutError:
            pass
        except ConnectionResetError:
            return True
        if sent < len(dribble):
            try:
                sock.sendall(dribble[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                return True
            sent += 1
    return False


REQUEST = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
SLOW = {
    "silent": (b"", b""),
    "half_a_head": (b"GET / HTTP/1.1\r\nHost: x\r\n", b""),
    "a_head_a_byte_at_a_time": (b"", b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200),
    "after_a_response_a_byte_at_a_time": (REQUEST, b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200),
    "a_body_a_byte_at_a_time": (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", b"a" * 99),
}


@pytest.mark.parametrize("name", list(SLOW))
def test_a_connection_without_a_complete_request_in_time_is_closed(http_server: int, name: str) -> None:
    first, dribble = SLOW[name]
    with socket.create_connection(("127.0.0.1", http_server)) as slow:
        slow.sendall(first)
        if first == REQUEST:  # its answer first: the deadline starts again after it
            slow.settimeout(5)
            assert slow.recv(4096).startswith(b"HTTP/1.1 200")
        assert _closed_by_server(slow, dribble), f"{name}: the connection is still open"
    with socket.create_connection(("127.0.0.1", http_server)) as ok:  # a real client is served
        ok.sendall(REQUEST)
        ok.settimeout(5)
        assert ok.recv(4096).startswith(b"HTTP/1.1 200")


async def _peer_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(scope["client"][0]).encode()})


@pytest.mark.parametrize(("trusted", "seen"), [(None, "127.0.0.1"), ("127.0.0.1", "203.0.113.9")])
def test_x_forwarded_for_counts_only_from_a_listed_proxy(monkeypatch: pytest.MonkeyPatch,
                                                         trusted: str | None, seen: str) -> None:
    """A job on the server's host (127.0.0.1) sending X-Forwarded-For would otherwise pick its
    address for the per-address 429 limit. Through the server's own uvicorn configuration."""
    from broker.api.server import FORWARDED_ALLOW_IPS

    if trusted is None:
        monkeypatch.delenv(FORWARDED_ALLOW_IPS, raising=False)
    else:
        monkeypatch.setenv(FORWARDED_ALLOW_IPS, trusted)
    with running(_peer_app) as port, socket.create_connection(("127.0.0.1", port)) as c:
        c.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.9\r\n"
                  b"Connection: close\r\n\r\n")
        c.settimeout(5)
        answer = b""
        while chunk := c.recv(4096):
            answer += chunk
    assert seen.encode() in answer.split(b"\r\n\r\n", 1)[1].split(b"\r\n")  # the chunked body

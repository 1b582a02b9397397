"""`onepool dashboard` on 127.0.0.1, loaded in headless Chromium over its DevTools protocol: wait
for the cost table to render, take a screenshot, check the table is on the page."""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.seed import seed

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1400,1000"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(what: str, check: Any, timeout: float = 30.0, every: float = 0.1) -> Any:
    """Poll `check()` until it returns something truthy (no event exists for these: an HTTP
    server coming up, a page finishing its render)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached in {timeout:g}s")
        time.sleep(every)


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.read()
    except OSError:
        return None


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's chromium, installed with apt-get when missing (CI runs as root)."""
    path = shutil.which("chromium")
    if path is None:
        if os.geteuid() != 0:
            pytest.skip("chromium is not installed and installing it needs root (apt-get install chromium)")
        subprocess.run(["apt-get", "update"], check=True, capture_output=True)
        subprocess.run(["apt-get", "install", "-y", "chromium"], check=True, capture_output=True,
                       env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        path = shutil.which("chromium")
    assert path, "apt-get install chromium did not provide a chromium binary"
    return path


@pytest.fixture
def dashboard(tmp_path: Path) -> Iterator[str]:
    home = seed(tmp_path / "home").store.home
    port = _free_port()
    log = open(tmp_path / "dashboard.log", "wb")  # noqa: SIM115  (closed below)
    proc = subprocess.Popen([sys.executable, "-m", "broker.client.cli", "--home", str(home), "dashboard",
                             "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        _until("dashboard health", lambda: _get(f"{url}/_stcore/health") == b"ok")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=10)
        log.close()


class DevTools:
    """The few Chrome DevTools Protocol calls this test needs, over one page's websocket."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=64 * 1024 * 1024, legacy=True)
        self.n = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=30))
            if msg.get("id") == self.n:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def eval(self, js: str) -> Any:
        return self.call("Runtime.evaluate", expression=js, returnByValue=True)["result"].get("value")


OPEN_COST_TAB = """(() => {
  const tab = [...document.querySelectorAll('[role="tab"], [data-testid="stTab"]')]
    .find(b => b.innerText.includes('Cost per experiment'));
  if (tab) tab.click();
  return !!tab;
})()"""
COST_TABLE_READY = """(() => {
  const t = document.querySelector('[data-testid="stTable"]');
  return !!t && t.offsetParent !== null && t.innerText.includes('lr-sweep')
    && t.innerText.includes('release');
})()"""


@pytest.mark.e2e
def test_dashboard_in_headless_chromium_shows_the_cost_table(chromium, dashboard, tmp_path):
    profile = tmp_path / "chromium-profile"
    proc = subprocess.Popen([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                             "--remote-debugging-port=0", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        port_file = profile / "DevToolsActivePort"
        port = _until("chromium devtools port", lambda: port_file.exists() and
                      port_file.read_text().split("\n")[0].strip())
        pages = _until("a page target", lambda: [p for p in json.loads(
            _get(f"http://127.0.0.1:{port}/json/list") or b"[]") if p.get("type") == "page"])
        dt = DevTools(pages[0]["webSocketDebuggerUrl"])
        dt.call("Page.enable")
        dt.call("Page.navigate", url=dashboard)
        _until("the dashboard's tabs", lambda: dt.eval(OPEN_COST_TAB), timeout=45, every=0.2)
        _until("the cost table", lambda: dt.eval(COST_TABLE_READY), timeout=30, every=0.2)
        shot = tmp_path / "dashboard.png"
        shot.write_bytes(base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"]))
        text = dt.eval("document.body.innerText")
        dt.ws.close()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "cost per experiment" in text and "onepool: GPUs and money" in text
    assert "lr-sweep" in text and "release" in text
    if os.environ.get("ONEPOOL_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["ONEPOOL_KEEP_SCREENSHOT"])

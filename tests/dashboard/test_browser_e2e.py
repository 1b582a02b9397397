"""`onepool dashboard` on 127.0.0.1, looked at in headless Chromium (over its DevTools protocol)
as a person would: every tab is opened, checked for what it must show, and photographed, for a
seeded home and for the home of a real `onepool demo` run; and over the API, where a member
follows a link, logs in on the login page and sees its team only. Screenshots go to
$ONEPOOL_SCREENSHOTS (default build/screenshots/), one PNG per tab and home.

Chromium is installed before pytest runs (`make test` -> infra/test/install-chromium.sh); this
test installs nothing. It also stops the dashboard with SIGTERM and checks that `onepool
dashboard` passed it on to Streamlit and waited for it: nothing is left on the port."""

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

from dashboard.tabs import TABS
from tests.conftest import ROOT
from tests.dashboard.seed import seed

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--window-size=1500,1500", "--hide-scrollbars"]
SHOTS = Path(os.environ.get("ONEPOOL_SCREENSHOTS") or ROOT / "build" / "screenshots")


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


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


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


@pytest.fixture(scope="module")
def chromium() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("chromium is not installed: `make test` installs it before pytest "
                    "(infra/test/install-chromium.sh, needs root and apt-get)")
    return path


@pytest.fixture(scope="module")
def browser(chromium: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevTools]:
    profile = tmp_path_factory.mktemp("chromium-profile")
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
        yield dt
        dt.ws.close()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _dashboard(home: Path | None, log: Path,
               url: str | None = None) -> tuple[subprocess.Popen[bytes], int, Any]:
    """`onepool dashboard` of `home`, or over the API at `url` (no token: its login page)."""
    port = _free_port()
    out = open(log, "wb")  # noqa: SIM115  (closed by _stop)
    env = {k: v for k, v in os.environ.items() if k not in ("ONEPOOL_HOME", "ONEPOOL_URL", "ONEPOOL_TOKEN")}
    where = ["--home", str(home)] if home is not None else []
    env.update({"ONEPOOL_URL": url} if url else {})
    proc = subprocess.Popen([sys.executable, "-m", "broker.client.cli", *where, "dashboard",
                             "--port", str(port)], stdout=out, stderr=subprocess.STDOUT, env=env)
    _until("dashboard health", lambda: _get(f"http://127.0.0.1:{port}/_stcore/health") == b"ok")
    return proc, port, out


def _stop(proc: subprocess.Popen[bytes], port: int, out: Any) -> None:
    """SIGTERM to `onepool dashboard` only (not its process group): it must pass it on to
    Streamlit and wait for it, so nothing listens on the port once it has exited."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=20)
    finally:
        out.close()
    assert code == 0, code
    assert not _port_open(port), "Streamlit still listens after `onepool dashboard` stopped"


# The visible tab's text as a person reads it: its text, the cells of its tables (drawn on a
# canvas, mirrored in an accessible grid) and the values shown in its select boxes.
ACTIVE_PANEL = """(() => { const p = document.querySelector('[role="tabpanel"]');
  if (!p || p.offsetParent === null) return null;
  const cells = [...p.querySelectorAll('[role="gridcell"], [role="columnheader"]')]
    .map(c => c.textContent.trim())
    .concat([...p.querySelectorAll('input[role="combobox"]')].map(i => i.value));
  return p.innerText + "\\n" + cells.join("\\n"); })()"""
ACTIVE_TAB = """[...document.querySelectorAll('[role="tab"]')].filter(b => b.getAttribute('aria-selected')
  === 'true').map(b => b.innerText.trim())[0]"""
CHARTS_DRAWN = """[...document.querySelectorAll('[role="tabpanel"] .vega-embed')]
  .filter(e => e.querySelector('canvas, svg')).length"""
# Streamlit re-runs the page every few seconds (the refresh): while it runs, parts of the page
# may be placeholders. A photo is taken only when none is visible.
AT_REST = """![...document.querySelectorAll('[data-testid="stSkeleton"], [data-testid="stSkeletonElement"]')]
  .some(e => e.offsetParent !== null)"""


ASSET_FAILED = "Failed to fetch dynamically imported module"


def _open(dt: DevTools, tab: str) -> None:
    clicked = dt.eval(f"""(() => {{
      const t = [...document.querySelectorAll('[role="tab"]')].find(b => b.innerText.trim() === {tab!r});
      if (t) t.click();
      return !!t && t.getAttribute('aria-selected') === 'true'; }})()""")
    if not clicked:
        _until(f"tab {tab} selected", lambda: dt.eval(
            f"""[...document.querySelectorAll('[role="tab"]')].some(b => b.innerText.trim() === {tab!r}
                && b.getAttribute('aria-selected') === 'true')"""), timeout=15, every=0.2)


def _look(dt: DevTools, tab: str, must_show: list[str], charts: int) -> str:
    """Open `tab`, wait until its panel shows every string and `charts` drawn charts, and
    return the panel's text."""
    _open(dt, tab)
    last: dict[str, Any] = {}

    def ready() -> str | None:
        last["text"], last["charts"] = dt.eval(ACTIVE_PANEL), dt.eval(CHARTS_DRAWN)
        if not last["text"] or not all(m in last["text"] for m in must_show):
            return None
        return last["text"] if last["charts"] >= charts and dt.eval(AT_REST) else None

    deadline, reloaded = time.monotonic() + 45, False
    while (text := ready()) is None:
        if not reloaded and ASSET_FAILED in (last["text"] or ""):
            # the browser lost one of Streamlit's own script chunks (a loaded machine): the
            # element cannot draw until the page loads again, as a person would reload it
            reloaded = True
            dt.eval("location.reload()")
            _until("the page's tabs after a reload", lambda: dt.eval(
                """document.querySelectorAll('[role="tab"]').length > 0"""), timeout=30, every=0.2)
            _open(dt, tab)
            continue
        if time.monotonic() > deadline:
            missing = [m for m in must_show if m not in (last["text"] or "")]
            pytest.fail(f"tab {tab}: after 45 s, missing {missing}, {last['charts']} of {charts} charts "
                        f"drawn; it shows: {(last['text'] or '')[:1500]!r}")
        time.sleep(0.25)
    time.sleep(0.5)  # let the charts finish their transition before the photo
    return text


def _photograph(dt: DevTools, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    shot = SHOTS / f"{name}.png"
    shot.write_bytes(base64.b64decode(dt.call("Page.captureScreenshot", format="png")["data"]))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    return shot


def _visit(dt: DevTools, url: str, source: str, expect: dict[str, tuple[list[str], int]]) -> dict[str, str]:
    dt.call("Page.navigate", url=url)
    for load in (1, 2):  # a page that lost one of Streamlit's script chunks (a loaded machine)
        try:             # draws no tabs until it loads again, as a person would reload it
            _until("the dashboard's tabs", lambda: dt.eval(
                "document.querySelectorAll('[role=\"tab\"]').length") == len(expect), timeout=60, every=0.2)
            break
        except pytest.fail.Exception:
            if load == 2:
                shown = dt.eval("document.body.innerText") or ""
                pytest.fail(f"no tabs after a reload; the page shows: {shown[:1500]!r}")
            dt.eval("location.reload()")
    seen = {}
    for i, (tab, (must_show, charts)) in enumerate(expect.items()):
        for _ in range(5):  # a refresh may start between the look and the photo: look again
            seen[tab] = _look(dt, tab, must_show, charts)
            _photograph(dt, f"{source}-{i + 1}-{tab.lower().replace(' & ', '-').replace(' ', '-')}")
            if dt.eval(AT_REST) and dt.eval(ACTIVE_PANEL) == seen[tab]:
                break
    return seen


@pytest.mark.e2e
def test_every_tab_of_a_seeded_home(browser: DevTools, tmp_path: Path) -> None:
    c = seed(tmp_path / "home")
    running = next(j for j in c.list() if j.status == "RUNNING")
    proc, port, out = _dashboard(c.store.home, tmp_path / "dashboard.log")
    try:
        seen = _visit(browser, f"http://127.0.0.1:{port}", "seeded", {
            "Overview": (["GPUs in use now", "jobs waiting now", "burn rate (USD/h)",
                          "GPUs in use by pool and class", "jobs waiting by class"], 2),
            "Cost per experiment": (["cost per experiment", "lr-sweep", "idle on-prem", "release"], 1),
            "Jobs": (["attempts", "spot_interruption", "40 of 100", f"{running.id}: sweep-2", "waiting"], 0),
            "Preemptions": (["with no work lost", "spot_interruption", "preempted", "prod"], 2),
            "Nodes & pools": (["pools", "nodes", "a100-0", "spot-0", "4"], 0),
            "Budgets": (["team budgets", "research"], 1),
            "Rebalancing": (["rebalancing moves", "onepool rebalance --dry-run"], 0),
            "Replay": (["replay the history under other settings", "PATH=VALUE"], 0),
        })
    finally:
        _stop(proc, port, out)
    overview = seen["Overview"].split("\n")
    assert overview[overview.index("GPUs in use now") + 2] == "1"  # as of now, not the last sample
    assert overview[overview.index("jobs waiting now") + 2] == "1"
    assert f"{sum(r.usd for r in c.costs('pool')):.2f}" in seen["Overview"]
    # Local, readable times (never raw epoch seconds) on every table.
    assert str(int(c.clock.now()))[:6] not in seen["Preemptions"] + seen["Jobs"]


@pytest.mark.e2e
@pytest.mark.timeout(300)  # includes running the demo (the session's demo_run), when this runs first
def test_every_tab_of_a_real_demo_run(browser: DevTools, demo_run: dict[str, Any], tmp_path: Path) -> None:
    home = Path(demo_run["home"])
    proc, port, out = _dashboard(home, tmp_path / "dashboard.log")
    try:
        seen = _visit(browser, f"http://127.0.0.1:{port}", "demo", {
            "Overview": (["GPUs in use now", "GPUs in use by pool and class"], 2),
            "Cost per experiment": (["lr-sweep", "release", "idle rented"], 1),
            "Jobs": (["attempts", "events"], 0),
            "Preemptions": (["preempted", "prod"], 2),
            "Nodes & pools": (["aws-spot", "a100-0", "l4-0"], 0),
            "Budgets": (["team budgets", "research", "prod"], 0),
            "Rebalancing": (["rebalancing moves"], 0),
            "Replay": (["replay the history under other settings"], 0),
        })
    finally:
        _stop(proc, port, out)
    lines = seen["Overview"].split("\n")
    assert lines[lines.index("GPUs in use now") + 2] == "0"  # the demo is over: nothing runs now
    assert lines[lines.index("jobs waiting now") + 2] == "0"
    assert "the broker is not running" in seen["Overview"] or "charged up to" in seen["Overview"]


@pytest.mark.e2e
def test_a_member_logs_in_over_the_api_and_sees_its_team_only(browser: DevTools, tmp_path: Path) -> None:
    """The dashboard on another "machine" than the database: `onepool dashboard` with ONEPOOL_URL
    and no token shows the login page; a member of prod, following a link to its waiting job,
    pastes its token, lands on that job, and sees prod's jobs, experiments and budget, and
    nothing of research's."""
    from broker.api.app import create_app
    from broker.clock import SystemClock
    from tests.agents.harness import serve

    c = seed(tmp_path / "home")
    token = c.create_token("prod").token or ""
    waiting = next(j.id for j in c.list() if j.name == "eval")
    api = serve(create_app(c.store, SystemClock()))
    proc, port, out = _dashboard(None, tmp_path / "dashboard.log", url=api.url)
    try:
        browser.call("Page.navigate", url=f"http://127.0.0.1:{port}/?tab=Jobs&job={waiting}")
        _until("the login page", lambda: browser.eval(
            "!!document.querySelector('input[type=\"password\"]')"), timeout=60, every=0.2)
        assert browser.eval("document.querySelectorAll('[role=\"tab\"]').length") == 0
        browser.eval("document.querySelector('input[type=\"password\"]').focus()")
        browser.call("Input.insertText", text=token)
        _until("the log-in button pressed", lambda: browser.eval("""(() => {
          const b = [...document.querySelectorAll('button')].find(x => x.innerText.trim() === 'log in');
          if (b) b.click();
          return !!b; })()"""), timeout=15)
        _until("the dashboard's tabs", lambda: browser.eval(
            "document.querySelectorAll('[role=\"tab\"]').length") == len(TABS), timeout=60, every=0.2)
        _until("the link's tab and job", lambda: browser.eval(ACTIVE_TAB) == "Jobs" and
               f"{waiting}: eval (pending)" in (browser.eval(ACTIVE_PANEL) or ""), timeout=30, every=0.2)
        seen = {tab: _look(browser, tab, must, 0) for tab, must in {
            "Jobs": ["eval", "head of the queue: holding 1 GPUs in a100"],
            "Cost per experiment": ["release"], "Budgets": ["prod"]}.items()}
        _photograph(browser, "member-login")
        assert "member of team prod" in browser.eval("document.body.innerText")
        assert "sweep" not in seen["Jobs"] and "lr-sweep" not in seen["Cost per experiment"]
        assert "research" not in seen["Budgets"] + seen["Jobs"]
        assert token not in browser.eval("location.href")
    finally:
        _stop(proc, port, out)
        api.stop()

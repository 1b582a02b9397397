"""A job with an `image:` runs each rank in a real podman container (providers.container):
signals reach the process inside, its exit status is kept, the container is removed; a job is
preempted, checkpoints from inside its container and resumes in another; an image that cannot
be pulled ends its attempt with that cause, not retried. See conftest.py for this machine's
quirks (kept in the node settings the tests give, not in the code a GPU host runs)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from providers.container import container_name
from providers.image_pull import pull_image_seconds
from providers.local import LocalProcesses
from tests.conftest import TRAIN, drive, train
from tests.containers.conftest import Lab

pytestmark = pytest.mark.e2e

SIGNALS = """
import os, signal, sys, time
def usr1(*_):
    print("usr1 in", "container" if os.path.exists("/run/.containerenv") else "host", flush=True)
def term(*_):
    print("term; pid", os.getpid(), flush=True)
    sys.exit(42)
signal.signal(signal.SIGUSR1, usr1)
signal.signal(signal.SIGTERM, term)
print("ready", os.environ.get("ONEPOOL_JOB_ID"), os.getcwd() == os.environ["ONEPOOL_JOB_DIR"], flush=True)
while True:
    time.sleep(0.02)
"""


@pytest.fixture
def node(lab: Lab, monkeypatch: pytest.MonkeyPatch) -> Lab:
    """This process as a node that runs containers (the lab's settings in its environment)."""
    for k, v in lab.settings.items():
        monkeypatch.setenv(k, v)
    return lab


def wait_for(path: Path, text: str, timeout: float = 30.0) -> str:
    """The file's text once it holds `text` (a rank's log: nothing to await but the file)."""
    deadline = time.monotonic() + timeout
    while True:
        got = path.read_text() if path.exists() else ""
        if text in got:
            return got
        assert time.monotonic() < deadline, f"{text!r} not in {path} after {timeout}s: {got[-2000:]!r}"
        time.sleep(0.02)


def test_signals_reach_the_process_inside_and_its_status_is_kept(node: Lab, tmp_path: Path):
    procs = LocalProcesses(tmp_path / "runs")
    env = {"ONEPOOL_IMAGE": node.image, "ONEPOOL_JOB_ID": "7", "ONEPOOL_TEAM": "research",
           "CUDA_VISIBLE_DEVICES": "0"}
    h = procs.start(1, 0, [sys.executable, "-c", SIGNALS], env)
    log = Path(h["run_dir"]) / "output.log"
    wait_for(log, "ready 7 True")
    procs.signal(h, signal.SIGUSR1)
    wait_for(log, "usr1 in container")
    procs.signal(h, signal.SIGTERM)
    text = wait_for(log, "term; pid")
    deadline = time.monotonic() + 30
    while (st := procs.status(h)).state == "running":
        assert time.monotonic() < deadline
        procs.wait_for_change(0.1)
    assert (st.state, st.exit_code, st.cause) == ("exited", 42, None), text
    assert text.count("usr1 in") == 1  # delivered once, not once per process of the group
    assert "pulled in" in text or "found on this node" in text
    assert node.podman("container", "exists", container_name(Path(h["run_dir"])), check=False).returncode == 1
    assert not (Path(h["run_dir"]) / "container.env").exists()  # the job's environment is gone

"""A job with an `image:` and a `setup:` (providers.container.run_setup): the setup runs once per
node per (image, code, setup) digest in a container of the image, committed as a derived image
that the node's later ranks run; the rank's code copy and its `data` links are visible inside
its container; a setup that fails ends the rank with its status. Real podman (see conftest.py
for this machine's quirks)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from broker.codepack import SHA_ENV, URI_ENV, pack
from providers.container import setup_image
from providers.local import LocalProcesses
from providers.rank_prep import setup_digest
from tests.containers.conftest import Lab

pytestmark = pytest.mark.e2e

# the setup changes the image (outside every mounted folder) and the rank's code copy
SETUP = ["mkdir -p /opt/lab", "echo installed > /opt/lab/tool", "echo built > made-by-setup"]
RANK = ("cat /opt/lab/tool; cat hello.txt; cat data/corpus.txt; "
        "test -e made-by-setup && echo own-copy-has-setup-output || echo own-copy-clean")


def _end(procs: LocalProcesses, h: dict) -> tuple[str, int | None, str]:
    deadline = time.monotonic() + 60
    while (st := procs.status(h)).state == "running":
        assert time.monotonic() < deadline, "the rank did not end"
        procs.wait_for_change(0.1)
    return st.state, st.exit_code, (Path(h["run_dir"]) / "output.log").read_text()


def test_setup_runs_once_per_node_into_a_derived_image_and_code_and_data_are_visible(
        lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in lab.settings.items():
        monkeypatch.setenv(k, v)
    src = tmp_path / "laptop"
    src.mkdir()
    (src / "hello.txt").write_text("hello from the laptop\n")
    snap = pack(src)
    store = tmp_path / "store"
    store.mkdir()
    (store / f"{snap.sha256}.tar").write_bytes(snap.data)
    (tmp_path / "corpus.txt").write_text("the corpus\n")
    env = {"ONEPOOL_IMAGE": lab.image, "ONEPOOL_TEAM": "research", SHA_ENV: snap.sha256,
           URI_ENV: f"file://{store}/{snap.sha256}.tar", "ONEPOOL_SETUP": json.dumps(SETUP),
           "ONEPOOL_DATA": json.dumps({"data/corpus.txt": f"file://{tmp_path}/corpus.txt"})}
    derived = setup_image(setup_digest(env))
    lab.podman("rmi", "-f", derived, check=False)
    monkeypatch.setenv("ONEPOOL_DATA_FILE_ROOTS", str(tmp_path))  # the node lets jobs read file:// here
    procs = LocalProcesses(tmp_path / "node" / "runs")
    try:
        logs = []
        for attempt in (1, 2):  # a second attempt of the job on the same node
            h = procs.start(attempt, 0, ["/bin/busybox", "sh", "-c", RANK], dict(env))
            state, code, log = _end(procs, h)
            assert (state, code) == ("exited", 0), log[-3000:]
            logs.append(log)
            phases = procs.phases(h)
            assert phases is not None and phases["setup_cached"] is (attempt == 2), phases
            assert isinstance(phases.get("pull_image_s"), float) and phases.get("pending") is False, phases
        first, second = logs
        for log in logs:
            assert "installed\nhello from the laptop\nthe corpus\n" in log, log[-2000:]
        assert "+ echo installed" in first and "onepool setup: done" in first
        assert "+ echo installed" not in second and "onepool setup: cached" in second
        assert "own-copy-has-setup-output" in first and "own-copy-clean" in second  # each rank its copy
        assert lab.podman("image", "exists", derived, check=False).returncode == 0
        # a setup that fails ends the rank with its status (the job's failure), keeps no image
        bad = {**env, "ONEPOOL_SETUP": json.dumps(["echo trying", "exit 7", "echo never"])}
        h = procs.start(3, 0, ["/bin/busybox", "true"], bad)
        state, code, log = _end(procs, h)
        assert (state, code) == ("exited", 7) and "onepool setup: failed (exit 7)" in log, log[-2000:]
        assert "trying" in log and "never" not in log.replace("echo never", "")
        assert lab.podman("image", "exists", setup_image(setup_digest(bad)), check=False).returncode == 1
        leftover = lab.podman("ps", "-a", "--format", "{{.Names}}", check=False).stdout
        assert "-setup" not in leftover
    finally:
        procs.kill_all()
        lab.podman("rmi", "-f", derived, check=False)

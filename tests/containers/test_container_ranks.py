"""A job with an `image:` runs each rank in a real podman container (providers.container):
signals reach the process inside, its exit status is kept, the container is removed; a job is
preempted, checkpoints from inside its container and resumes in another; an image that cannot
be pulled ends its attempt with that cause, not retried. See conftest.py for this machine's
quirks (kept in the node settings the tests give, not in the code a GPU host runs)."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from providers.container import container_name
from providers.image_pull import pull_image_seconds
from providers.local import LocalProcesses
from tests.conftest import drive, train
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


IN_CONTAINER = ("import os, runpy, sys; "
                "print('in container:', os.path.exists('/run/.containerenv'), flush=True); "
                "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def test_a_container_job_is_preempted_checkpoints_inside_and_resumes_in_another_container(
        node: Lab, make_cluster, tmp_path: Path):
    """On a local node of this machine: the low job checkpoints from inside its container, is
    preempted by an urgent one, and resumes from that checkpoint in a new container (the image
    now cached). The same across two agents that share nothing (each pulls the image itself):
    tests/lab/test_lab.py, in-a-container."""
    c, eng = make_cluster()
    low = c.submit(name="low", team="research", image=node.image, gpus_per_node=2, priority="low",
                   workdir=str(tmp_path),  # (not the checkout: the lab mounts it read-only)
                   command=[sys.executable, "-c", IN_CONTAINER, *train(40, step_s=0.05, ckpt_every=2)[1:]]).id
    drive(eng, lambda: (c.get(low).last_step or -1) >= 4)
    urgent = c.submit(name="urgent", team="prod", command=train(2), gpus_per_node=2, priority="urgent").id
    drive(eng, lambda: c.get(low).status == "SUCCEEDED" and c.get(urgent).status == "SUCCEEDED", timeout=60)
    info = c.get(low)
    first, second = info.attempt_list
    assert (first.end_reason, second.end_reason) == ("PREEMPTED", "COMPLETED")
    assert second.restored_step is not None and second.restored_step >= 4
    runs = c.store.home / "runs"
    for a in (first, second):
        out = (runs / f"attempt-{a.id}" / "rank-0" / "output.log").read_text()
        assert "in container: True" in out, out[-2000:]
    out2 = (runs / f"attempt-{second.id}" / "rank-0" / "output.log").read_text()
    assert f"resumed from step {second.restored_step} (attempt 2)" in out2
    pulls = [json.loads((runs / f"attempt-{a.id}" / "rank-0" / "image.json").read_text())
             for a in (first, second)]
    assert pulls[1]["cached"] is True
    assert pull_image_seconds(runs / f"attempt-{second.id}" / "rank-0") == pulls[1]["pull_image_s"]
    names = {container_name(runs / f"attempt-{a.id}" / "rank-0") for a in (first, second)}
    assert len(names) == 2
    print(f"\npull_image: first {pulls[0]['pull_image_s']:.3f}s (cached={pulls[0]['cached']}), "
          f"resume {pulls[1]['pull_image_s']:.3f}s (cached)")


def test_an_image_that_cannot_be_pulled_fails_its_attempt_with_that_cause_once(node: Lab, make_cluster):
    c, eng = make_cluster(pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 4}])
    j = c.submit(name="typo", team="research", image=f"{node.registry}/onepool/no-such-image:1",
                 command=["python", "train.py"], gpus_per_node=2).id
    drive(eng, lambda: c.get(j).status == "FAILED")
    info = c.get(j)
    assert info.attempts == 1 and info.attempt_list[0].cause == "start_failed:image_not_found"
    final = next(e for e in c.events(j) if e.kind == "start_failed_final")
    assert "not found in its registry" in final.message
    assert "no-such-image" in c.logs(j).data


def test_a_dead_supervisors_container_is_killed_and_removed(node: Lab, tmp_path: Path):
    """The supervisor dies (SIGKILL) while its container runs: the job inside is found by its
    rank's tag (ORPHANED), killed with the rank, and its container removed by whoever sees the
    rank end."""
    procs = LocalProcesses(tmp_path / "runs")
    h = procs.start(1, 0, [sys.executable, "-c", SIGNALS], {"ONEPOOL_IMAGE": node.image})
    run_dir = Path(h["run_dir"])
    wait_for(run_dir / "output.log", "ready")
    os.kill(h["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (st := procs.status(h)).state == "running":
        assert time.monotonic() < deadline
        procs.wait_for_change(0.1)
    assert st.state == "orphaned"  # the job inside lives on without its supervisor
    while (st := procs.status(h)).state == "orphaned":
        assert time.monotonic() < deadline, "the container's job survived its rank's kill"
        procs.kill(h)
        time.sleep(0.05)
    assert st.state == "lost"  # no status recorded: the broker requeues it
    assert node.podman("container", "exists", container_name(run_dir), check=False).returncode == 1
    assert not (run_dir / "container.env").exists() and not (run_dir / "container.json").exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1], ids=["sigterm", "sigusr1"])
def test_a_signal_during_the_pull(node: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: int):
    """While the image is pulled, a SIGTERM (preemption, cancel) ends the rank 143 without
    starting its container (it stops the pull too: that is no pull failure); a SIGUSR1
    ("checkpoint now") neither stops the pull nor reaches the job, which has nothing to save
    yet (and would die of it before its handler is set)."""
    gate, pulling = tmp_path / "pull-may-finish", tmp_path / "pulling"
    slow = tmp_path / "slow-podman"
    slow.write_text(f"#!/bin/sh\n# the lab's podman, whose pulls wait for {gate}\n"
                    'if [ "$1 $2" = "image exists" ]; then exit 1; fi\n'
                    f'if [ "$1" = pull ]; then touch {pulling}; '
                    f'while [ ! -e {gate} ]; do sleep 0.02; done; fi\n'
                    f'exec {node.cli} "$@"\n')
    slow.chmod(0o755)
    monkeypatch.setenv("ONEPOOL_CONTAINER_CLI", str(slow))
    procs = LocalProcesses(tmp_path / "runs")
    h = procs.start(1, 0, [sys.executable, "-c", SIGNALS], {"ONEPOOL_IMAGE": node.image})
    run_dir = Path(h["run_dir"])
    deadline = time.monotonic() + 30
    while not pulling.exists():  # the supervisor pulls (no event to await: another process)
        assert time.monotonic() < deadline
        time.sleep(0.02)
    procs.signal(h, sig)
    gate.touch()
    if sig == signal.SIGUSR1:
        wait_for(run_dir / "output.log", "ready")
        procs.signal(h, signal.SIGTERM)
        wait_for(run_dir / "output.log", "term; pid")
    while (st := procs.status(h)).state == "running":
        assert time.monotonic() < deadline
        procs.wait_for_change(0.1)
    log = (run_dir / "output.log").read_text()
    if sig == signal.SIGTERM:
        assert (st.state, st.exit_code, st.cause) == ("exited", 143, None) and "ready" not in log, log
    else:
        assert (st.state, st.exit_code, st.cause) == ("exited", 42, None) and "usr1 in" not in log, log
        assert "pulled in" in log
    assert node.podman("container", "exists", container_name(run_dir), check=False).returncode == 1

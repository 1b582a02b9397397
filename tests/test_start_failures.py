"""A rank that cannot start ends its attempt with a cause naming why (providers.start_errors),
and the job ends: at once when only the job can be at fault, else after
`broker.max_start_failures` tries on different nodes. Real processes on a local pool."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import drive, train


@dataclass(frozen=True)
class Bad:
    """A job that cannot start: what it is given, and the cause and exit code it must end with."""

    name: str
    make: Callable[[Path], dict[str, Any]]  # tmp folder -> submit() kwargs
    cause: str
    exit_code: int | None
    after: Callable[[Path], None] = lambda t: None  # what changes after the submit


def workdir(tmp: Path) -> str:
    """A working directory the submit accepts (it exists then); `vanish` or `turn_to_file`
    it afterwards, as a typo on another host or a deleted checkout would."""
    (tmp / "projct").mkdir()
    return str(tmp / "projct")


def vanish(tmp: Path) -> None:
    if (tmp / "projct").is_dir():
        (tmp / "projct").rmdir()


def turn_to_file(tmp: Path) -> None:
    vanish(tmp)
    (tmp / "projct").write_text("x")


def script(tmp: Path, name: str, text: str, mode: int = 0o755) -> str:
    path = tmp / name
    path.write_text(text)
    path.chmod(mode)
    return str(path)


BAD = [
    Bad("workdir-missing", lambda t: {"command": ["true"], "workdir": workdir(t)},
        "start_failed:workdir_missing", None, vanish),
    Bad("workdir-is-a-file", lambda t: {"command": ["true"], "workdir": workdir(t)},
        "start_failed:workdir_not_a_directory", None, turn_to_file),
    Bad("no-shebang", lambda t: {"command": [script(t, "run.sh", "echo hi\n")]},
        "start_failed:exec_format_error", 126),
    Bad("command-not-found", lambda t: {"command": ["onepool-no-such-command"]},
        "start_failed:command_not_found", 127),
    Bad("bad-interpreter", lambda t: {"command": [script(t, "run.py", "#!/no/such/python3\nprint(1)\n")]},
        "start_failed:bad_interpreter", 127),
    Bad("not-executable", lambda t: {"command": [script(t, "run.sh", "#!/bin/sh\necho hi\n", 0o644)]},
        "start_failed:permission_denied", 126),
]


@pytest.mark.parametrize("bad", BAD, ids=[b.name for b in BAD])
def test_a_rank_that_cannot_start_ends_its_attempt_with_its_cause(make_cluster, tmp_path, bad: Bad):
    c, eng = make_cluster()
    j = c.submit(name="bad", team="research", gpus_per_node=1, **bad.make(tmp_path)).id
    bad.after(tmp_path)
    good = c.submit(name="good", team="research", command=train(3), gpus_per_node=1).id
    drive(eng, lambda: c.get(j).status == "FAILED" and c.get(good).status == "SUCCEEDED")
    info = c.get(j)
    # one node in this pool: nowhere else to try, whoever is at fault
    assert [a.cause for a in info.attempt_list] == [bad.cause]
    assert info.attempt_list[0].exit_code == bad.exit_code
    [final] = [e for e in c.events(j) if e.kind == "start_failed_final"]
    assert bad.cause in final.message and final.data["cause"] == bad.cause


def test_a_bogus_pythonhome_ends_the_attempt_with_the_jobs_exit_status_not_requeued(make_cluster):
    """The job's PYTHONHOME reaches the job, not its supervisor: the job's interpreter fails
    (exit 1) and the attempt ends FAILED, instead of a supervisor that dies without a status
    (LOST, requeued without end)."""
    c, eng = make_cluster()
    j = c.submit(name="bad", team="research", command=[sys.executable, "-c", "print(1)"],
                 env={"PYTHONHOME": "/no/such/home"}, gpus_per_node=1).id
    drive(eng, lambda: c.get(j).status in ("FAILED", "SUCCEEDED"))
    info = c.get(j)
    assert info.status == "FAILED" and info.attempts == 1 and info.attempt_list[0].exit_code == 1
    assert "PYTHONHOME" in c.logs(j).data or "encodings" in c.logs(j).data


FOUR_NODES = [{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 4}]


@pytest.mark.parametrize(("limit", "attempts"), [(3, 3), (1, 1), (5, 4)])
def test_a_node_side_start_failure_is_tried_on_other_nodes_then_fails(make_cluster, tmp_path, limit,
                                                                      attempts):
    """A missing working directory may be the node's: the job goes back to the queue and
    avoids the nodes it failed on; it fails after `max_start_failures` tries (or once it failed
    on every node), each on a different node."""
    c, eng = make_cluster(pools=FOUR_NODES, max_start_failures=limit)
    j = c.submit(name="typo", team="research", command=["true"], workdir=workdir(tmp_path),
                 gpus_per_node=2).id
    vanish(tmp_path)
    drive(eng, lambda: c.get(j).status == "FAILED")
    info = c.get(j)
    nodes = [a.alloc[0][0] for a in info.attempt_list]
    assert len(nodes) == attempts and len(set(nodes)) == attempts, nodes
    assert {a.cause for a in info.attempt_list} == {"start_failed:workdir_missing"}
    kinds = [e.kind for e in c.events(j)]
    assert kinds.count("start_failed_final") == 1


def test_a_job_side_start_failure_fails_at_once_even_with_other_nodes(make_cluster, tmp_path):
    c, eng = make_cluster(pools=FOUR_NODES)
    j = c.submit(name="noshebang", team="research", command=[script(tmp_path, "run.sh", "echo hi\n")],
                 gpus_per_node=2).id
    drive(eng, lambda: c.get(j).status == "FAILED")
    info = c.get(j)
    assert info.attempts == 1 and info.attempt_list[0].cause == "start_failed:exec_format_error"
    assert "same way" in next(e for e in c.events(j) if e.kind == "start_failed_final").message


def test_preemptions_do_not_count_as_start_failures(make_cluster, tmp_path):
    """A job that started before, was preempted, then cannot start (its workdir vanished) has
    had one start failure, not two."""
    c, eng = make_cluster(pools=FOUR_NODES, max_start_failures=2)
    wd = tmp_path / "wd"
    wd.mkdir()
    j = c.submit(name="low", team="research", command=train(400), workdir=str(wd), gpus_per_node=2,
                 priority="low").id
    drive(eng, lambda: c.get(j).status == "RUNNING")
    aid = c.get(j).attempt_list[0].id
    eng.interrupt(aid, cause="spot_interruption")
    os.rmdir(wd)
    drive(eng, lambda: c.get(j).status == "FAILED", advance=1.0)
    causes = [a.cause for a in c.get(j).attempt_list]
    assert causes[0] == "spot_interruption" and causes[1:] == ["start_failed:workdir_missing"] * 2


def test_onepool_status_shows_the_cause(make_cluster, tmp_path):
    from tests.test_cli import cli, cli_json, flat

    c, eng = make_cluster()
    j = c.submit(name="noshebang", team="research", command=[script(tmp_path, "run.sh", "echo hi\n")],
                 gpus_per_node=1).id
    drive(eng, lambda: c.get(j).status == "FAILED")
    home = c.store.home
    assert cli_json(home, "status", str(j))["attempt_list"][0]["cause"] == "start_failed:exec_format_error"
    assert "start_failed:exec_format_error" in flat(cli(home, "status", str(j)).stdout)


def test_a_supervisor_that_cannot_start_ends_the_rank_as_a_start_failure(make_cluster, monkeypatch):
    """A supervisor that exits by itself before recording anything (its interpreter broken on
    this node) ends its rank as start_failed:supervisor_failed, not LOST without a status (which
    requeued the job without end)."""
    import providers.local

    monkeypatch.setattr(providers.local, "SUPERVISOR", ("-c", "import sys; sys.exit(3)"))
    c, eng = make_cluster()
    j = c.submit(name="j", team="research", command=["true"], gpus_per_node=1).id
    drive(eng, lambda: c.get(j).status not in ("PENDING", "RUNNING"))
    info = c.get(j)
    assert info.status == "FAILED" and info.attempts == 1  # one node: nowhere else to try
    assert info.attempt_list[0].cause == "start_failed:supervisor_failed"
    assert info.attempt_list[0].exit_code == 3



def test_an_argument_too_large_for_exec_fails_the_start_with_its_cause(tmp_path):
    """A job spec refuses such an argument at submit (test_spec); a rank that still meets E2BIG
    (an environment the node adds to) fails its start with that cause instead of escaping."""
    from providers.base import StartFailed
    from providers.local import LocalProcesses

    local = LocalProcesses(tmp_path / "runs", containment="group")
    with pytest.raises(StartFailed) as failed:
        local.start(1, 0, ["echo", "x" * 200_000], {})
    assert failed.value.cause == "start_failed:too_large"


def test_a_sigterm_right_after_the_start_reaches_the_job(tmp_path):
    """A cancel or a preemption that comes while the supervisor is still setting the rank up
    (before the job exists) is passed on to the job once it runs: the rank ends at once instead
    of running on until the broker's grace is over. Tried at several delays after the start."""
    import signal
    import time

    from providers.base import RankState
    from providers.local import LocalProcesses

    local = LocalProcesses(tmp_path / "runs", containment="group")
    job = ["sh", "-c", "trap 'exit 42' TERM; while :; do sleep 0.05; done"]
    for i, delay in enumerate((0.0, 0.02, 0.05, 0.1, 0.2)):
        h = local.start(i + 1, 0, job, {})
        time.sleep(delay)
        local.signal(h, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while (st := local.status(h)).state == RankState.RUNNING and time.monotonic() < deadline:
            local.wait_for_change(0.1)
        assert st.state != RankState.RUNNING, f"still running {delay}s after a SIGTERM at start"
        local.kill(h)

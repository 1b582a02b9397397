"""Issue 27, part 1: a change to the queue wakes the broker loop at once instead of waiting out
`cycle_s`, from this process (a listener) or from another on the same home (the wake file)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control import service
from broker.control.engine import CycleReport
from broker.spec import parse_config
from broker.state import wake as wake_mod
from broker.state.wake import Wake, WakeWatch
from tests.conftest import ROOT, config, kill_leftovers

Loop = tuple[Client, "queue.Queue[CycleReport]"]
FOREVER_S = 3600.0  # the loop's cycle interval here: only a wake-up makes a second cycle
# Waiting longer than this is a missed wake-up (the leader's scheduled tasks wake the old loop
# after ~30 s): the woken cycle comes in milliseconds.
WOKEN_WITHIN_S = 10.0


def submit_here(c: Client) -> int:
    return c.submit(name="urgent", team="prod", command=["sleep", "30"], gpus_per_node=1).id


def submit_from_another_process(c: Client, home: Path | None = None) -> int:
    """Submit from a process of its own, on `home` (default: the loop's), on this test's
    database (ONEPOOL_DATABASE_URL, set by the db fixture, is inherited)."""
    code = ("import sys; from broker.client.sdk import Client; "
            "print(Client(sys.argv[1]).submit(name='urgent', team='prod', command=['sleep', '30'], "
            "gpus_per_node=1).id)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, str(home or c.store.home)], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60, check=True)
    return int(out.stdout.strip())


@pytest.fixture
def loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    """A broker loop (service.run) in a thread on a fresh SQLite home, cycling every FOREVER_S;
    each cycle's report arrives on the queue (on the db fixture's database)."""
    clock = FakeClock()
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config()))
    reports: queue.Queue[CycleReport] = queue.Queue()
    monkeypatch.setattr(service, "describe", reports.put)
    stop = threading.Event()
    t = threading.Thread(target=service.run, args=(c.store, clock),
                         kwargs={"cycle_s": FOREVER_S, "stop": stop}, daemon=True)
    t.start()
    try:
        reports.get(timeout=30)  # the first cycle: an empty queue
        yield c, reports
    finally:
        stop.set()
        c.store.wake.poke()
        t.join(timeout=30)
        kill_leftovers(c.store.home / "runs")


@pytest.mark.parametrize("submit", [submit_here, submit_from_another_process],
                         ids=["same-process", "another-process"])
def test_a_submit_starts_the_next_cycle_without_waiting_out_the_interval(
        loop: Loop, submit: Callable[[Client], int]) -> None:
    c, reports = loop
    job = submit(c)
    started: list[int] = []
    while job not in started:  # the woken cycle starts it (a later one at the latest)
        started += reports.get(timeout=WOKEN_WITHIN_S).started  # old code: ~30 s
    assert c.get(job).status == "RUNNING"


@pytest.mark.parametrize("db", ["postgresql"], indirect=True)
def test_through_postgresql_a_submit_wakes_a_broker_that_shares_no_home(
        loop: Loop, tmp_path: Path, db: str) -> None:
    c, reports = loop
    job = submit_from_another_process(c, tmp_path / "elsewhere")  # its wake file is not the loop's
    started: list[int] = []
    while job not in started:
        started += reports.get(timeout=WOKEN_WITHIN_S).started  # NOTIFY onepool_wake


def test_a_cancel_wakes_the_loop_to_stop_the_job(loop: Loop) -> None:
    c, reports = loop
    job = submit_here(c)
    while job not in reports.get(timeout=30).started:
        pass
    c.cancel(job)
    stopped: list[int] = []
    while job not in stopped:
        rep = reports.get(timeout=WOKEN_WITHIN_S)
        stopped += rep.preempted + rep.killed + [j for j, _ in rep.ended]


# (pokes before the look, pokes at EMPTY_AT, whether the watch sees a change)
WATCHES = [
    pytest.param(0, False, False, id="never-poked"),
    pytest.param(1, False, True, id="one-poke"),
    pytest.param(3, False, True, id="several-pokes-one-wake"),
    pytest.param(1, True, True, id="full-file-emptied"),
]


@pytest.mark.parametrize(("pokes", "full", "seen"), WATCHES)
def test_the_wake_file_is_a_change_counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           pokes: int, full: bool, seen: bool) -> None:
    if full:
        monkeypatch.setattr(wake_mod, "EMPTY_AT", 1)
    w = Wake(tmp_path)
    watch = WakeWatch(w)
    heard: list[int] = []
    remove = w.listen(lambda: heard.append(1))
    for _ in range(pokes):
        w.poke()
    assert len(heard) == pokes  # in-process listeners hear every poke at once
    assert watch.poked() is seen
    assert watch.poked() is False  # once per change
    if full:
        assert w.path.stat().st_size == 0  # emptied before the cycle it triggers
    w.poke()  # after emptying too, a poke is a change
    assert watch.poked() is True
    remove()
    w.poke()
    assert len(heard) == pokes + 1


def test_a_home_that_cannot_be_written_loses_only_the_cross_process_wake(tmp_path: Path) -> None:
    w = Wake(tmp_path / "missing-folder")
    heard: list[int] = []
    w.listen(lambda: heard.append(1))
    w.poke()  # no error: the other process's broker wakes at its next cycle
    assert heard == [1] and w.stamp() == (0, 0, 0)

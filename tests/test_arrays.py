"""Arrays and sweeps end to end (issue 29): the spec's checks, one submit writing every
element in one transaction, and an engine with real processes keeping an array's limit."""

from __future__ import annotations

import sys

import pytest
import yaml
from sqlmodel import select

from broker.client.sdk import Client
from broker.errors import SpecError
from broker.spec import parse_job
from broker.state.model import Event, Job
from tests.conftest import drive

BASE = {"name": "sw", "team": "research", "command": ["python", "train.py", "--lr={lr}"]}


@pytest.mark.parametrize(("extra", "says"), [
    ({"array": "0-3", "sweep": {"lr": [1]}}, "give one of them"),
    ({"max_running": 2}, "max_running: only an array or a sweep"),
    ({"array": "0-3%2", "max_running": 2}, "already gives its limit"),
    ({"sweep": {"lr": [1], "seed": [0]}}, "sweep: seed filled nowhere"),
    ({"array": "9-1"}, "array: range '9-1' must go up"),
    ({"sweep": {"lr": []}}, "sweep: lr: needs at least one value"),
    ({"array": "0-3", "max_running": 0}, "max_running: Input should be greater than or equal to 1"),
])
def test_bad_arrays_are_refused_naming_the_field(extra, says):
    with pytest.raises(SpecError) as e:
        parse_job({**BASE, **extra})
    assert says in str(e.value)


@pytest.mark.parametrize(("extra", "indices", "commands", "limit"), [
    ({}, [-1], [["python", "train.py", "--lr={lr}"]], None),
    ({"array": "0-2%2"}, [0, 1, 2], [["python", "train.py", "--lr={lr}"]] * 3, 2),
    ({"sweep": {"lr": [0.001, 0.0003]}, "max_running": 1}, [0, 1],
     [["python", "train.py", "--lr=0.001"], ["python", "train.py", "--lr=0.0003"]], 1),
])
def test_elements(extra, indices, commands, limit):
    js = parse_job({**BASE, **extra})
    els = js.elements()
    assert [i for i, _, _ in els] == indices and [c for _, c, _ in els] == commands
    assert js.array_limit == limit
    if indices != [-1]:
        assert [env["ONEPOOL_ARRAY_INDEX"] for _, _, env in els] == [str(i) for i in indices]


def test_sweep_fills_env_values_too():
    js = parse_job({**BASE, "command": ["run"], "env": {"LR": "{lr}", "SEED": "s{seed}"},
                    "sweep": {"lr": [1e-3], "seed": [0, 1]}})
    assert [env for _, _, env in js.elements()] == [
        {"LR": "0.001", "SEED": "s0", "ONEPOOL_ARRAY_INDEX": "0"},
        {"LR": "0.001", "SEED": "s1", "ONEPOOL_ARRAY_INDEX": "1"}]


PRINT = "import os, sys; print('lr', sys.argv[1], 'index', os.environ['ONEPOOL_ARRAY_INDEX'])"


def test_sweep_runs_at_most_its_limit_at_once(make_cluster, tmp_path):
    """Four elements, %2, two GPUs each free: never more than two elements hold GPUs, the
    others wait naming the array's limit, every element ends with its own filled values."""
    c, eng = make_cluster(pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 4, "nodes": 1}])
    first = c.submit(name="sw", team="research", command=[sys.executable, "-c", PRINT, "{lr}"],
                     sweep={"lr": [0.1, 0.2, 0.3, 0.4]}, max_running=2, workdir=str(tmp_path))
    assert first.array_id == first.id and first.array_index == 0
    ids = list(range(first.id, first.id + 4))
    with c.store.session() as s:
        jobs = s.exec(select(Job).where(Job.array_id == first.id).order_by(Job.id)).all()
        assert [(j.id, j.array_index, j.array_limit) for j in jobs] == [(i, n, 2) for n, i in enumerate(ids)]
        assert len({j.checkpoint_uri for j in jobs}) == 4  # each element its own checkpoints
    most = 0

    def done() -> bool:
        nonlocal most
        infos = [c.get(i) for i in ids]
        most = max(most, sum(j.status == "RUNNING" for j in infos))
        return all(j.status == "SUCCEEDED" for j in infos)

    eng.cycle()
    held = [c.get(i) for i in ids[2:]]
    assert all(j.status == "PENDING" and "at most 2 elements running" in (j.waiting_reason or "")
               for j in held)
    drive(eng, done, advance=1.0)
    assert most == 2
    for n, i in enumerate(ids):
        log = (c.store.home / "runs" / f"attempt-{c.get(i).attempt_list[0].id}" / "rank-0" /
               "output.log").read_text()
        assert f"lr 0.{n + 1} index {n}" in log
    with c.store.session() as s:
        sub = s.exec(select(Event).where(Event.kind == "submitted", Event.job_id == ids[3])).one()
        assert f"element 3 of array {first.id}" in sub.message
    eng.cycle()  # the ledger charged up to the last end
    row = next(r for r in c.costs("array") if r.key == f"array {first.id}")
    assert row.jobs == 4 and row.gpu_hours > 0


def test_cli_array_and_yaml_sweep(tmp_path, monkeypatch):
    """`onepool submit --array` and a `sweep:` in -f FILE each make one job per element in one
    submit; `status` names each element's array and index."""
    from rich.console import Console

    import broker.client.cli_out
    from broker.client.cli import app
    from tests.test_cli import CONFIG, cli, cli_json, flat, runner

    monkeypatch.setattr(broker.client.cli_out, "out", Console(width=250))
    home = tmp_path / "home"
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(CONFIG))
    cli(home, "apply", "-c", str(tmp_path / "c.yaml"))
    res = cli(home, "submit", "--name", "arr", "--team", "prod", "--array", "0-2%2", "--", "true")
    assert "submitted array 1 (arr, normal)" in flat(res.stdout)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: sw\nteam: research\ncommand: python t.py --lr {lr}\n"
                    "sweep: {lr: [0.001, 0.0003]}\n")
    info = cli_json(home, "submit", "-f", str(spec))
    assert (info["id"], info["array_id"], info["array_index"]) == (4, 4, 0)
    rows = sorted(cli_json(home, "status"), key=lambda j: j["id"])  # the page is newest first
    assert [(j["id"], j["array_id"], j["array_index"]) for j in rows] == [
        (1, 1, 0), (2, 1, 1), (3, 1, 2), (4, 4, 0), (5, 4, 1)]
    assert "arr [1:2]" in cli(home, "status").stdout
    with Client(home).store.session() as s:
        assert s.get(Job, 5).command == ["python", "t.py", "--lr", "0.0003"]
    assert [j["id"] for j in cli_json(home, "status", "--array", "4")] == [4, 5]
    cli(home, "cancel", "2")
    after = cli_json(home, "cancel", "--array", "1")
    assert [(j["id"], j["status"]) for j in after] == [(1, "CANCELLED"), (2, "CANCELLED"), (3, "CANCELLED")]
    assert cli_json(home, "status", "5")["status"] == "PENDING"
    res = runner.invoke(app, ["--home", str(home), "cancel", "--array", "2"])
    assert res.exit_code != 0 and "no array with id 2" in str(res.exception)

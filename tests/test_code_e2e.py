"""Code snapshots on a local pool (issue 26), real processes: a job submitted with `code` runs
in a private copy of the packed folder, not in the folder itself; a second job with the same
code fetches nothing; a stored copy that no longer matches its digest ends the attempt with
`start_failed:code_unverified` after one more fetch."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker.state.model import Job
from tests.conftest import drive

SCRIPT = """import os, pathlib
print("cwd", os.getcwd())
print("reads", pathlib.Path("data.txt").read_text())
pathlib.Path("data.txt").write_text("changed by the job")
"""


def _project(tmp: Path) -> Path:
    proj = tmp / "proj"
    proj.mkdir()
    (proj / "run.py").write_text(SCRIPT)
    (proj / "data.txt").write_text("packed")
    (proj / "secret.key").write_text("k")
    (proj / ".onepoolignore").write_text("*.key\n")
    return proj


def test_a_job_runs_in_a_private_copy_of_its_snapshot(make_cluster, tmp_path: Path) -> None:
    c, eng = make_cluster()
    proj = _project(tmp_path)
    jobs = [c.submit(name=f"c{i}", team="research", command=[sys.executable, "run.py"], code=str(proj)).id
            for i in range(2)]
    drive(eng, lambda: all(c.get(j).status == "SUCCEEDED" for j in jobs))
    for j in jobs:
        out = c.logs(j).data
        assert "reads packed" in out, out
        cwd = out.split("cwd ", 1)[1].split("\n", 1)[0]
        assert Path(cwd).name == "code" and Path(cwd) != proj
    assert (proj / "data.txt").read_text() == "packed"  # the submit folder is not the job's
    cache = eng.executor.code  # type: ignore[attr-defined]
    assert cache.stats["fetches"] == 1 and cache.stats["hits"] == 1
    [digest] = cache.holds()
    assert not (cache.root / digest / "secret.key").exists()
    assert (cache.root / digest / "data.txt").read_text() == "packed"


def test_a_damaged_stored_snapshot_fails_the_attempt_with_its_cause(make_cluster, tmp_path: Path) -> None:
    c, eng = make_cluster(max_start_failures=1)
    j = c.submit(name="d", team="research", command=[sys.executable, "run.py"],
                 code=str(_project(tmp_path))).id
    with c.store.session() as s:
        row = s.get(Job, j)
        assert row is not None and row.code_uri is not None
        Path(row.code_uri.removeprefix("file://")).write_bytes(b"not what was uploaded")
    drive(eng, lambda: c.get(j).status == "FAILED")
    assert [a.cause for a in c.get(j).attempt_list] == ["start_failed:code_unverified"]
    assert eng.executor.code.stats["fetches"] == 2  # type: ignore[attr-defined]


def test_the_snapshot_follows_the_job_to_its_pools_store(make_cluster, tmp_path: Path) -> None:
    """Uploaded to the broker's store, fetched by the pool's nodes from the pool's own store."""
    store = tmp_path / "pool-store"
    c, eng = make_cluster(pools=[{"name": "a100", "gpu_type": "A100", "gpus_per_node": 2, "nodes": 1,
                                  "store": f"file://{store}"}])
    j = c.submit(name="f", team="research", command=[sys.executable, "run.py"],
                 code=str(_project(tmp_path))).id
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    [copy] = list(store.glob("code/research/*.tar.gz"))
    with c.store.session() as s:
        row = s.get(Job, j)
        assert row is not None and row.code_sha256 and copy.name == f"{row.code_sha256}.tar.gz"
        assert row.code_uri and Path(row.code_uri.removeprefix("file://")).exists()  # the original stays
    [start] = [e for e in c.events(j) if e.kind == "started"]
    assert "reads packed" in c.logs(j).data and start
    # the copy is egress of its attempt, like a checkpoint's (on-prem to on-prem: priced at $0)
    [a] = c.get(j).attempt_list
    assert a.egress_bytes == copy.stat().st_size and a.egress_usd == 0.0
    [copied] = [e for e in c.events(j) if e.kind == "code_copied"]
    assert copied.data["bytes"] == copy.stat().st_size and copied.data["to"] == f"file://{store}"
    j2 = c.submit(name="g", team="research", command=[sys.executable, "run.py"],
                  code=str(tmp_path / "proj")).id
    drive(eng, lambda: c.get(j2).status == "SUCCEEDED")
    assert c.get(j2).attempt_list[0].egress_bytes == 0  # already there: copied once, charged once


def test_setup_runs_once_per_node_per_digest_with_its_output_in_the_log(make_cluster, tmp_path: Path) -> None:
    """Two jobs with the same code and setup: the first runs it (its output in the job's log,
    its time printed), the second finds it cached; another setup runs again; a failing setup
    fails its job with the command's status and leaves no marker."""
    c, eng = make_cluster()
    proj = _project(tmp_path)
    count = tmp_path / "ran"
    setup = [f"echo setting up; echo x >> {count}"]

    def submit(name: str, steps: list[str]) -> int:
        return c.submit(name=name, team="research", command=[sys.executable, "run.py"], code=str(proj),
                        setup=steps).id

    first = submit("s1", setup)
    drive(eng, lambda: c.get(first).status == "SUCCEEDED")
    second, other = submit("s2", setup), submit("s3", [*setup, "true"])
    failing = submit("s4", "exit 7")
    drive(eng, lambda: all(c.get(j).status in ("SUCCEEDED", "FAILED") for j in (second, other, failing)))
    assert [c.get(j).status for j in (second, other, failing)] == ["SUCCEEDED", "SUCCEEDED", "FAILED"]
    assert count.read_text() == "x\nx\n"  # s1 and s3: s2 was cached
    log1, log2 = c.logs(first).data, c.logs(second).data
    assert "onepool setup: $ echo setting up" in log1 and "setting up\n" in log1 and "done in" in log1
    assert "onepool setup: cached on this node" in log2 and "setting up\n" not in log2
    assert "reads packed" in log1 and "reads packed" in log2  # then the job ran, in its code
    assert c.get(failing).attempt_list[0].exit_code == 7
    assert "failed (exit 7): exit 7" in c.logs(failing).data
    markers = list((eng.executor.runs_dir.parent / "setup-cache").rglob("*.done"))  # type: ignore[attr-defined]
    assert len(markers) == 2
    # restart phases: timed on the node, kept on the attempt, told in an event
    p1, p2 = (c.get(j).attempt_list[0].phases or {} for j in (first, second))
    assert {"fetch_code_s", "setup_s"} <= set(p1) and p1["setup_cached"] is False and not p1["pending"]
    assert p2["setup_cached"] is True
    [ev] = [e for e in c.events(second) if e.kind == "phases"]
    assert "fetch code" in ev.message and "(cached)" in ev.message


READER = """import os, pathlib
print("file", pathlib.Path("inputs/train.csv").read_text())
print("dir", sorted(os.listdir("ds")))
print("modes", oct(os.stat("inputs/train.csv").st_mode & 0o777), oct(os.stat("ds").st_mode & 0o777))
"""


def test_data_is_fetched_once_per_version_and_linked_read_only(make_cluster, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ONEPOOL_DATA_FILE_ROOTS", str(tmp_path))  # the node lets jobs read file:// here
    c, eng = make_cluster()
    src = tmp_path / "bucket"
    (src / "ds").mkdir(parents=True)
    (src / "train.csv").write_text("v1")
    (src / "ds" / "a.bin").write_text("a")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "read.py").write_text(READER)
    data = {"inputs/train.csv": f"file://{src}/train.csv", "ds": f"file://{src}/ds"}

    def run(name: str) -> str:
        j = c.submit(name=name, team="research", command=[sys.executable, "read.py"],
                     code=str(tmp_path / "proj"), data=data).id
        drive(eng, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"))
        assert c.get(j).status == "SUCCEEDED", c.logs(j).data
        return c.logs(j).data

    first = run("d1")
    assert "file v1" in first and "dir ['a.bin']" in first and "modes 0o444 0o555" in first
    cache = eng.executor.data  # type: ignore[attr-defined]
    assert cache.stats == {"fetches": 2, "hits": 0}
    assert "file v1" in run("d2") and cache.stats == {"fetches": 2, "hits": 2}
    (src / "train.csv").write_text("v2, a new version")
    assert "file v2, a new version" in run("d3") and cache.stats == {"fetches": 3, "hits": 3}
    assert (src / "train.csv").read_text() == "v2, a new version"  # the source was never written

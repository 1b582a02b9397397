"""Names from jobs are data, never paths: hostile manifests against every store (a local folder,
S3 on moto, GCS on fake-gcs-server and on gcp-storage-emulator), in both directions of a copy
(from the store under test to a local folder, and from a local folder into it).

Every case: step 1 is a good checkpoint, step 2 a hostile one. The restore point must be step 1
(step 2 damaged, the event naming the bad entry), nothing may appear outside the destination's
step-1 folder (the whole temporary folder and the buckets are listed before and after), and the
job's own restore (latest_valid) falls back to step 1 too.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import pytest

from broker.checkpoint import checkpoints as CHECKPOINTS
from broker.checkpoint import names
from broker.checkpoint.checkpoints import CheckpointStore, FileEntry, NotAsDeclared, job_prefix
from broker.checkpoint.names import BadName, check_files, check_name
from broker.checkpoint.resume import fetch_restore_point
from broker.errors import CheckpointError
from pricing.egress import Location, provider_of

Backend = tuple[str, str, dict[str, Any]]
TARGET = "pwned.txt"  # what the traversal cases aim at, in the test's temporary folder


def entry(data: bytes, size: int | None = None, sha: str | None = None) -> dict[str, Any]:
    return {"size": len(data) if size is None else size,
            "sha256": sha or hashlib.sha256(data).hexdigest()}


@dataclass
class Case:
    listed: list[tuple[str, dict[str, Any]]]  # the manifest's file list, in the order written
    stored: dict[str, bytes] = field(default_factory=dict)  # objects put in the step folder
    want: str = ""  # in the checkpoint_damaged event
    step: int = 2  # the step the manifest claims
    max_files: int | None = None  # a lower MAX_FILES for the case
    meta: dict[str, Any] = field(default_factory=dict)  # other manifest fields, overridden


def cases(target: Path) -> dict[str, Case]:
    up = "../" * 40 + str(target).lstrip("/")
    bad = b"the job's bytes"
    return {
        "traversal": Case([(up, entry(bad))], want=repr(up)),
        "absolute": Case([(str(target), entry(bad))], want="is absolute"),
        "drive_backslash": Case([("C:\\x", entry(bad))], want="holds '\\\\'"),
        "drive": Case([("C:/x", entry(bad))], want="has a drive part"),
        "backslash": Case([("a\\..\\..\\x", entry(bad))], want="holds '\\\\'"),
        "nul": Case([("a\x00b", entry(bad))], want="holds '\\x00'"),
        "newline": Case([("a\nb", entry(bad))], want="holds '\\n'"),
        "glob": Case([("*", entry(bad))], stored={"w": bad}, want="holds '*'"),
        "dotdot_inside": Case([("a/../../b", entry(bad))], want="'..' component"),
        "empty": Case([("", entry(bad))], want="empty;"),
        "dot": Case([(".", entry(bad))], want="'.' component"),
        "empty_component": Case([("a//b", entry(bad))], want="has an empty component"),
        "trailing_slash": Case([("a/", entry(bad))], want="has an empty component"),
        "manifest_name": Case([("manifest.json", entry(bad))], want="manifest's own name"),
        "pending_name": Case([(".manifest-x.json", entry(bad))], want="reserved prefix"),
        "aside_name": Case([("d/.onepool-x.part", entry(bad))], want="reserved prefix"),
        "duplicate": Case([("w", entry(b"one")), ("w", entry(bad))], stored={"w": bad},
                          want="listed twice"),
        "file_is_folder": Case([("a", entry(b"1")), ("a/b", entry(bad))], stored={"a/b": bad},
                               want="also a folder of"),
        "hash_mismatch": Case([("w", entry(b"good"))], stored={"w": b"evil"},
                              want="does not match its manifest"),
        "size_mismatch": Case([("w", entry(bad, size=len(bad) + 1))], stored={"w": bad},
                              want="does not match its manifest"),
        "absurd_size": Case([("w", entry(bad, size=1 << 60))], stored={"w": bad},
                            want=f"size {1 << 60} must be"),
        "negative_size": Case([("w", entry(bad, size=-1))], stored={"w": bad}, want="size -1"),
        "bad_sha": Case([("w", entry(bad, sha="../../x"))], stored={"w": bad}, want="64 lowercase hex"),
        "too_many": Case([(f"f{i}", entry(bad)) for i in range(4)],
                         stored={f"f{i}": bad for i in range(4)}, want="more than 3 files",
                         max_files=3),
        "wrong_step": Case([("w", entry(b"1"))], step=1, want="says step 1 in the folder of step 2"),
        "huge_field": Case([("w", entry(bad))], stored={"w": bad}, meta={"copied_from": "x" * 5000},
                           want="field 'copied_from'"),
        "nan_time": Case([("w", entry(bad))], stored={"w": bad}, meta={"time": float("nan")},
                         want="field 'time'"),
        "nested_written_by": Case([("w", entry(bad))], stored={"w": bad},
                                  meta={"written_by": {"pool": {"a": 1}}}, want="field 'written_by'"),
    }


CASES = list(cases(Path("/t")))


def manifest_text(step: int, listed: list[tuple[str, dict[str, Any]]],
                  meta: dict[str, Any] | None = None) -> str:
    """A manifest as a job could write it (keys may repeat: written by hand)."""
    body = ", ".join(f"{json.dumps(n)}: {json.dumps(e)}" for n, e in listed)
    head = json.dumps({"format": 1, "step": step, "time": 2.0, "job_id": 1, "attempt": 1,
                       "written_by": {}, "world_size": 1, "writer": "evil", **(meta or {})})
    return head[:-1] + ', "files": {' + body + "}}"


def plant(st: CheckpointStore, case: Case) -> None:
    """Step 1 good (written by the store), step 2 hostile (written behind its back)."""
    st.write(1, {"w": b"good one"}, job_id=1, attempt=1, now=1)
    st.fs.makedirs(st.step_path(2), exist_ok=True)
    for name, data in case.stored.items():
        st.fs.makedirs(st.step_path(2, name).rsplit("/", 1)[0], exist_ok=True)
        st.fs.pipe_file(st.step_path(2, name), data)
    text = manifest_text(case.step, case.listed, case.meta)
    st.fs.pipe_file(st.step_path(2, "manifest.json"), text.encode())


def everything(tmp_path: Path, buckets: list[str], opts: dict[str, Any]) -> set[str]:
    """Every file in the test's folder and every object in the buckets."""
    out = {str(p) for p in tmp_path.rglob("*") if p.is_file() or p.is_symlink()}
    for b in buckets:
        fs, root = fsspec.core.url_to_fs(b, **opts)
        fs.invalidate_cache()
        out |= {f"{b.split('://')[0]}://{k}" for k in fs.find(root)}
    return out


@pytest.mark.parametrize("direction", ["from_store", "into_store"])
@pytest.mark.parametrize("case_id", CASES)
def test_hostile_manifest_is_damaged_and_writes_nothing_outside(
        backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case_id: str,
        direction: str) -> None:
    kind, root, opts = backend
    target = tmp_path / TARGET
    case = cases(target)[case_id]
    if case.max_files is not None:
        monkeypatch.setattr(names, "MAX_FILES", case.max_files)
    local_root = f"file://{tmp_path}/local-store"
    src_root, dst_root = (root, local_root) if direction == "from_store" else (local_root, root)
    src = CheckpointStore(job_prefix(src_root, "t", "e", 1), opts if src_root == root else {})
    dst = CheckpointStore(job_prefix(dst_root, "t", "e", 1), opts if dst_root == root else {})
    plant(src, case)
    buckets = [root] if kind != "file" else []
    before = everything(tmp_path, buckets, opts)

    def stores(prefix: str) -> CheckpointStore:  # the restore point opens stores by prefix
        return src if prefix == src.uri else dst

    monkeypatch.setattr("broker.checkpoint.resume.CheckpointStore", lambda p: stores(p))
    rp = fetch_restore_point([src.uri], dst.uri, now=5, locate=lambda r: Location(provider_of(r)))

    assert rp.step == 1 and rp.damaged == [(src_root, 2)]
    damaged = [m for k, m, _ in rp.events if k == "checkpoint_damaged"]
    assert len(damaged) == 1 and case.want in damaged[0], damaged
    assert not target.exists() and not os.path.lexists(target)
    new = everything(tmp_path, buckets, opts) - before
    step1 = dst.step_path(1) if dst.local else f"{dst_root.split('://')[0]}://{dst.step_path(1)}"
    outside = sorted(p for p in new if not p.startswith(step1 + "/"))
    assert outside == [], f"written outside {step1}: {outside}"
    assert dst.steps() == [1] and dst.manifest(1) is not None
    m, notes = src.latest_valid()
    assert m is not None and m.step == 1 and len(notes) == 1 and "step 2 damaged" in notes[0]


def test_symlinks_in_a_local_store_are_never_followed(tmp_path: Path) -> None:
    """A job with a local store links a file of its step to a secret, and its next step's folder
    to a folder of the server's: neither is read, nor written through."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"the server's secret")
    outside = tmp_path / "outside"
    outside.mkdir()
    src = CheckpointStore(job_prefix(f"file://{tmp_path}/a", "t", "e", 1))
    dst = CheckpointStore(job_prefix(f"file://{tmp_path}/b", "t", "e", 1))
    src.write(1, {"w": b"good one"}, now=1)
    src.write(2, {"w": b"placeholder"}, now=2)
    w = Path(src.step_path(2, "w"))
    w.unlink()
    w.symlink_to(secret)
    listed = [("w", entry(secret.read_bytes()))]
    Path(src.step_path(2, "manifest.json")).unlink()
    Path(src.step_path(2, "manifest.json")).write_text(manifest_text(2, listed))
    Path(dst.step_path(2)).parent.mkdir(parents=True)
    Path(dst.step_path(2)).symlink_to(outside)  # the destination's step 2 leads elsewhere

    rp = fetch_restore_point([src.uri], dst.uri, now=5, locate=lambda r: Location(provider_of(r)))

    assert rp.step == 1  # both step 2s are damaged: the source's file and the target's folder are links
    assert sorted(rp.damaged) == [(f"file://{tmp_path}/a", 2), (f"file://{tmp_path}/b", 2)]
    assert all("symbolic link" in m for k, m, _ in rp.events if k == "checkpoint_damaged")
    assert list(outside.iterdir()) == [] and secret.read_bytes() == b"the server's secret"
    m, notes = src.latest_valid()
    assert m is not None and m.step == 1 and "symbolic link" in notes[0]
    with pytest.raises(BadName, match="symbolic link"):
        src.read(2, "w")
    with pytest.raises(BadName, match="symbolic link"):
        dst.delete(2)  # retention does not delete through a link either


@pytest.mark.parametrize(("declared", "written"), [
    (b"good", b"evil"),  # hash mismatch
    (b"good", b"goo"),  # size mismatch
    (b"good", b"good and more"),
])
def test_a_file_written_aside_is_visible_only_if_it_matches(
        backend: Backend, declared: bytes, written: bytes) -> None:
    _, root, opts = backend
    st = CheckpointStore(job_prefix(root, "t", "e", 1), opts)
    want = FileEntry(len(declared), hashlib.sha256(declared).hexdigest())

    def fill(path: str) -> None:
        st.fs.pipe_file(path, written)

    with pytest.raises(NotAsDeclared, match="sub/w: wrote"):
        st.put_verified(3, "sub/w", want, fill)
    st.fs.invalidate_cache()
    assert st.fs.find(st.step_path(3)) == []  # nothing under its name, nothing aside
    st.put_verified(3, "sub/w", want, lambda p: st.fs.pipe_file(p, declared))
    st.fs.invalidate_cache()
    assert st.read(3, "sub/w") == declared
    assert [p.rsplit("/", 1)[-1] for p in st.fs.find(st.step_path(3))] == ["w"]


@pytest.mark.parametrize(("name", "ok"), [
    ("arrays.npz", True), ("rank-00001/model.pt", True), (".hidden/x", True), ("a..b", True),
    ("ünïcode/名前", True), ("x" * 255, True), ("x" * 256, False), ("/".join(["x" * 200] * 6), False),
    ("../x", False), ("x/..", False), ("./x", False), ("/x", False), ("C:x", False), ("c:/x", False),
    ("a\\b", False), ("a\x00", False), ("a\x7f", False), ("a?b", False), ("a[0]", False), ("", False),
    ("\ud800", False), (7, False), (None, False),
])
def test_check_name_table(name: object, ok: bool) -> None:
    if ok:
        assert check_name(name) == name
    else:
        with pytest.raises(BadName, match="bad checkpoint file name"):
            check_name(name)


BuildList = Callable[[], list[tuple[Any, Any]]]


@pytest.mark.parametrize(("build", "error"), [
    (lambda: [("a", entry(b"1")), ("b/c", entry(b"2"))], None),
    (lambda: [("a", entry(b"1")), ("a", entry(b"1"))], "listed twice"),
    (lambda: [("a/b", entry(b"1")), ("a", entry(b"1"))], "also a folder of 'a/b'"),
    (lambda: [("a", {"size": True, "sha256": "0" * 64})], "size True"),
    (lambda: [("a", {"size": 1.0, "sha256": "0" * 64})], "size 1.0"),
    (lambda: [("a", {"size": 1})], "sha256 None"),
    (lambda: [("a", "x")], "entry must be"),
    (lambda: [(f"f{i}", entry(b"")) for i in range(names.MAX_FILES + 1)], "more than 100000 files"),
    (lambda: [(f"f{i}", entry(b"", size=names.MAX_FILE_BYTES)) for i in range(21)], "add up to more"),
])
def test_check_files_table(build: BuildList, error: str | None) -> None:
    if error is None:
        assert set(check_files(build())) == {"a", "b/c"}
    else:
        with pytest.raises(BadName, match=error.replace("(", r"\(")):
            check_files(build())


def test_a_shard_marker_cannot_list_files_outside_its_shard(tmp_path: Path) -> None:
    st = CheckpointStore(job_prefix(f"file://{tmp_path}", "t", "e", 1))
    st.write_shard(4, 0, {"w": b"rank 0"})
    st.fs.pipe_file(st.step_path(4, "rank-00001.json"),
                    json.dumps({"rank-00000/w": entry(b"forged")}).encode())
    with pytest.raises(BadName, match="outside its shard folder rank-00001/"):
        st.gather_shards(4, 2)


def test_an_oversized_manifest_is_damaged_not_read_whole(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    st = CheckpointStore(job_prefix(f"file://{tmp_path}", "t", "e", 1))
    st.write(1, {"w": b"1"}, now=1)
    st.write(2, {"w": b"2"}, now=2)
    limit = Path(st.step_path(1, "manifest.json")).stat().st_size + 10
    monkeypatch.setattr("broker.checkpoint.checkpoints.MAX_MANIFEST_BYTES", limit)
    Path(st.step_path(2, "manifest.json")).write_text(" " * (limit + 1))
    m = st.manifest(2)
    assert m is not None and m.files == {} and f"larger than {limit} bytes" in m.problems[0]
    assert st.latest_valid()[0].step == 1  # type: ignore[union-attr]


def test_markers_a_job_writes_are_read_only_when_small(tmp_path: Path) -> None:
    """A job fills its progress marker (read every few seconds by the broker) and a shard
    marker: neither is read whole."""
    st = CheckpointStore(job_prefix(f"file://{tmp_path}", "t", "e", 1))
    st.mark_progress(2, 5, 1.0)
    assert st.progress(2) is not None and st.progress(2)["step"] == 5  # type: ignore[index]
    big = b'{"step": 5, "time": 1, "pad": "' + b"x" * (CHECKPOINTS.MAX_MARKER_BYTES) + b'"}'
    st.fs.pipe_file(st._path("_attempts", "attempt-00002.json"), big)
    assert st.progress(2) is None
    st.fs.pipe_file(st._path("_attempts", "attempt-00002.json"), b"[1, 2]")
    assert st.progress(2) is None  # not an object
    st.mark_done(2, 0, 1.0)
    st.fs.pipe_file(st._path("_attempts", "attempt-00002-done-rank-00001.json"), big)
    assert st.all_done(2, 2)  # a marker's presence is what counts
    st.write_shard(4, 0, {"w": b"rank 0"})
    st.fs.pipe_file(st.step_path(4, "rank-00001.json"), b" " * (CHECKPOINTS.MAX_MANIFEST_BYTES + 1))
    with pytest.raises(CheckpointError, match="rank 1 has no complete shard"):
        st.gather_shards(4, 2)


FORGED_NUMBERS = """
import json, sys
import fsspec
from broker import runtime
ctx = runtime.context()
runtime.save(3, arrays={"x": [1]}, block=True)
fs, root = fsspec.core.url_to_fs(ctx.checkpoint_uri)
fs.makedirs(f"{root}/step-{'9' * 25}", exist_ok=True)
fs.pipe_file(f"{root}/step-{'9' * 25}/w", b"x")  # a step no database column holds
fs.makedirs(f"{root}/_attempts", exist_ok=True)
fs.pipe_file(f"{root}/_attempts/attempt-{ctx.attempt:05d}.json",
             json.dumps({"step": 2 ** 70, "time": 1.0, "total": 2 ** 70}).encode())
open(sys.argv[1], "w").close()
"""


def test_numbers_a_job_writes_that_no_column_holds_are_ignored(make_cluster: Any, tmp_path: Path) -> None:
    """A step folder numbered beyond int64 and a progress marker at 2**70: the broker indexes
    neither (it used to fail every cycle trying to store them) and the job ends normally."""
    from tests.conftest import drive

    c, eng = make_cluster()
    flag = tmp_path / "written"
    j = c.submit(name="forger", team="research", command=[sys.executable, "-c", FORGED_NUMBERS, str(flag)],
                 gpus_per_node=1).id
    drive(eng, lambda: c.get(j).status in ("SUCCEEDED", "FAILED"))
    assert c.get(j).status == "SUCCEEDED", c.events(j)
    info = c.get(j)
    assert flag.exists() and info.last_step == 3 and info.progress_step is None
    st = CheckpointStore(info.checkpoint_uri)
    assert st.steps() == [3]
    with pytest.raises(CheckpointError, match="step must be from 0 to"):
        st.step_path(10**18)


def test_retention_marks_a_late_hostile_manifest_damaged(make_cluster: Any, clock: Any) -> None:
    """An upload seen without a manifest gets one later, naming a path outside: retention
    indexes the step damaged (kept for a look, never resumed from), not committed."""
    from sqlmodel import select

    from broker.state.model import Checkpoint
    from tests.conftest import drive, train

    c, eng = make_cluster(keep_checkpoints=2, checkpoint_delete_delay_s=100)
    j = c.submit(name="r", team="research", command=train(6, 0.02, 2), gpus_per_node=1).id
    drive(eng, lambda: c.get(j).last_step is not None)
    st = CheckpointStore(c.get(j).checkpoint_uri)
    st.fs.makedirs(st.step_path(1000), exist_ok=True)
    st.fs.pipe_file(st.step_path(1000, "w"), b"x")  # seen without a manifest first
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    st.fs.pipe_file(st.step_path(1000, "manifest.json"),
                    manifest_text(1000, [("../../../../x", entry(b"x"))]).encode())
    clock.advance(100)
    eng.cycle()
    with c.store.session() as s:
        row = s.exec(select(Checkpoint).where(Checkpoint.job_id == j, Checkpoint.step == 1000)).one()
    assert row.state == "damaged" and 1000 in st.steps()

"""The checkpoint layout and commit protocol, one contract run against every store: a local
folder, S3 (moto server + s3fs), GCS enforcing preconditions (fake-gcs-server + gcsfs) and GCS
ignoring them (gcp-storage-emulator + gcsfs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from broker.checkpoint.checkpoints import MANIFEST, CheckpointStore, Manifest, job_prefix, step_name
from broker.errors import CheckpointError
from tests.conftest import ROOT

Backend = tuple[str, str, dict[str, Any]]
ENFORCING = {"file", "s3", "gcs"}  # stores whose create-only writes are enforced


@pytest.fixture
def store(backend: Backend) -> CheckpointStore:
    _, root, opts = backend
    return CheckpointStore(job_prefix(root, "team", "exp", 7), opts)


def put(st: CheckpointStore, step: int, name: str, data: bytes) -> None:
    """Write one object behind the store's back (damage, a torn upload)."""
    st.fs.makedirs(st.step_path(step), exist_ok=True)
    st.fs.pipe_file(st.step_path(step, name), data)


def test_layout_and_manifest(store: CheckpointStore) -> None:
    m = store.write(3, {"a.bin": b"hello", "sub/b.txt": b"x" * 10}, job_id=7, attempt=1,
                    written_by={"provider": "local", "region": "here"}, now=12.5)
    names = sorted(p.rsplit("/", 1)[-1] for p in store.fs.find(store.step_path(3)))
    assert names == ["a.bin", "b.txt", MANIFEST]  # the pending manifest is gone
    assert store.step_uri(3).endswith("/team/exp/7/step-000000000003")
    got = store.manifest(3)
    assert got is not None and got == m and got.writer == m.writer != ""
    assert got.files["a.bin"].size == 5 and got.bytes == 15 and got.world_size == 1
    assert got.written_by == {"provider": "local", "region": "here"}
    assert store.verify(got) == []
    assert store.latest_valid() == (m, [])


def test_folder_without_manifest_is_not_a_checkpoint(store: CheckpointStore) -> None:
    store.write(1, {"w": b"one"}, now=1)
    put(store, 5, "w", b"half")
    assert store.steps() == [1, 5]
    assert [m.step for m in store.committed()] == [1]
    m, notes = store.latest_valid()
    assert m is not None and m.step == 1 and notes == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_checkpoint_falls_back(store: CheckpointStore, damage: str) -> None:
    store.write(1, {"w": b"one"}, now=1)
    store.write(2, {"w": b"two!"}, now=2)
    if damage == "flip":
        put(store, 2, "w", b"twO!")
    elif damage == "truncate":
        put(store, 2, "w", b"tw")
    else:
        store.fs.rm_file(store.step_path(2, "w"))
    m, notes = store.latest_valid()
    assert m is not None and m.step == 1
    assert len(notes) == 1 and "step 2 damaged" in notes[0]


def test_garbled_manifest_is_ignored(store: CheckpointStore) -> None:
    store.write(1, {"w": b"one"}, now=1)
    store.write(2, {"w": b"two"}, now=2)
    put(store, 2, MANIFEST, b'{"format": 1, "st')
    assert [m.step for m in store.committed()] == [1]


def test_committed_step_is_immutable(store: CheckpointStore) -> None:
    store.write(1, {"w": b"one"}, now=1)
    with pytest.raises(CheckpointError, match="already committed"):
        store.write(1, {"w": b"other"}, now=2)
    assert store.read(1, "w") == b"one"


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../../b", MANIFEST, ".manifest-x.json"])
def test_bad_file_names_refused(tmp_path: Path, bad: str) -> None:
    st = CheckpointStore(f"file://{tmp_path}/ck")
    with pytest.raises(CheckpointError):
        st.write(1, {bad: b"x"}, now=0)


# -- the commit protocol under concurrent writers ------------------------------------------
def test_writer_that_commits_after_another_finished_is_refused(store: CheckpointStore) -> None:
    """A uploads, then B uploads and commits, then A commits: A is told, B's step is intact."""
    a_entries = store.put_files(4, {"w": b"A" * 5})
    b = store.write(4, {"w": b"B" * 7}, attempt=2, now=2)
    with pytest.raises(CheckpointError, match="already committed"):
        store.commit(4, a_entries, attempt=1, now=1)
    m, notes = store.latest_valid()
    assert m == b and notes == [] and store.read(4, "w") == b"B" * 7


def test_simultaneous_commits_never_yield_a_mixed_checkpoint(
        store: CheckpointStore, backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """B does its whole save inside A's commit, between A's last check and A's promote.

    Enforcing stores refuse A's promote. A store that ignores preconditions lets A overwrite
    B's manifest while the files are B's: readers must then see a damaged step and fall back,
    never a checkpoint that mixes the two writers."""
    store.write(0, {"w": b"zero"}, now=0)
    a_entries = store.put_files(4, {"w": b"A" * 5})
    real = store._create_only
    calls = []

    def b_sneaks_in(pending: str, final: str, data: bytes) -> None:
        if not calls:
            calls.append(1)
            other = CheckpointStore(store.uri, backend[2])
            other.write(4, {"w": b"B" * 7}, attempt=2, now=2)
        real(pending, final, data)

    monkeypatch.setattr(store, "_create_only", b_sneaks_in)
    if backend[0] in ENFORCING:
        with pytest.raises(CheckpointError, match="another writer"):
            store.commit(4, a_entries, attempt=1, now=1)
        m, notes = store.latest_valid()
        assert m is not None and m.step == 4 and m.attempt == 2 and notes == []
    else:
        store.commit(4, a_entries, attempt=1, now=1)  # last writer wins: A is told success
        m, notes = store.latest_valid()
        assert m is not None and m.step == 0  # A's manifest over B's files: damaged, skipped
        assert len(notes) == 1 and "step 4 damaged" in notes[0]


def test_writer_overwritten_before_its_read_back_is_told(
        store: CheckpointStore, monkeypatch: pytest.MonkeyPatch) -> None:
    entries = store.put_files(4, {"w": b"A" * 5})
    foreign = Manifest(step=4, time=9, job_id=7, attempt=2, written_by={}, files=entries,
                       writer="someone-else")
    real = store.manifest

    def overwritten_then_read(step: int) -> Manifest | None:
        put(store, 4, MANIFEST, foreign.to_json().encode())
        return real(step)

    monkeypatch.setattr(store, "manifest", overwritten_then_read)
    with pytest.raises(CheckpointError, match="committed by another writer"):
        store.commit(4, entries, attempt=1, now=1)


# -- multi-node shards ---------------------------------------------------------------------
def test_shards_commit_only_when_every_rank_wrote_one(store: CheckpointStore) -> None:
    store.write_shard(2, 0, {"arrays.npz": b"rank0"})
    assert store.missing_shards(2, 3) == [1, 2]
    store.write_shard(2, 2, {"arrays.npz": b"rank2"})
    assert store.missing_shards(2, 3) == [1]
    with pytest.raises(CheckpointError, match="rank 1 has no complete shard"):
        store.gather_shards(2, 3)
    assert store.committed() == []
    store.write_shard(2, 1, {"arrays.npz": b"rank1!"})
    m = store.commit(2, store.gather_shards(2, 3), world_size=3, now=5)
    assert m.world_size == 3 and sorted(m.files) == [
        "rank-00000/arrays.npz", "rank-00001/arrays.npz", "rank-00002/arrays.npz"]
    assert store.verify(m) == [] and store.read(2, "rank-00001/arrays.npz") == b"rank1!"


def test_runtime_rank0_does_not_commit_without_every_shard(
        store: CheckpointStore, backend: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import runtime

    ctx = runtime.Context.from_env({"ONEPOOL_CHECKPOINT_URI": store.uri, "ONEPOOL_RANK": "0",
                                    "ONEPOOL_WORLD_SIZE": "2", "ONEPOOL_GRACE_S": "0.3"})
    monkeypatch.setattr(runtime, "SHARD_POLL_S", 0.05)
    with pytest.raises(CheckpointError, match=r"rank\(s\) \[1\] wrote no shard"):
        runtime._upload(ctx, store, 3, {"arrays.npz": b"r0"})
    assert store.committed() == [] and store.steps() == [3]


# -- the runtime in a real process ----------------------------------------------------------
SAVER = """
import sys
from broker import runtime
import numpy as np
runtime.save(1, arrays={"w": np.arange(3)}, block=True)
print("saved 1", flush=True)
pending = runtime.save(2, files={"a.bin": sys.argv[1], "b.fifo": sys.argv[2]})
print("saving 2 in the background:", pending.done(), flush=True)
runtime.wait()
"""


@pytest.mark.parametrize("which", ["file", "s3", "gcs"])
def test_process_killed_mid_upload_leaves_previous_checkpoint(
        which: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """A real process is SIGKILLed while its background upload of step 2 is blocked reading a
    FIFO (a.bin already uploaded, no manifest): restore() must return step 1."""
    root = {"file": lambda: f"file://{tmp_path}/store", "s3": lambda: request.getfixturevalue("s3_bucket"),
            "gcs": lambda: request.getfixturevalue("gcs_bucket")}[which]()
    uri = job_prefix(root, "t", "e", 1)
    (tmp_path / "a.bin").write_bytes(b"A" * 1000)
    fifo = tmp_path / "b.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "ONEPOOL_JOB_ID": "1", "ONEPOOL_ATTEMPT": "1", "ONEPOOL_CHECKPOINT_URI": uri}
    p = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path / "a.bin"), str(fifo)],
                         env=env, stdout=subprocess.PIPE, cwd=ROOT)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == b"saved 1"
    assert p.stdout.readline().strip() == b"saving 2 in the background: False"  # save() returned
    # Opening the FIFO for writing blocks until the uploader opens it for reading: then it
    # is inside the upload of step 2, with a.bin written and no manifest yet.
    with open(fifo, "wb") as w:
        w.write(b"partial")
        w.flush()
        st = CheckpointStore(uri)
        assert st._exists(st.step_path(2, "a.bin"))
        p.send_signal(signal.SIGKILL)
        p.wait()
    st = CheckpointStore(uri)
    assert st.steps() == [1, 2] and [m.step for m in st.committed()] == [1]
    out = subprocess.run(
        [sys.executable, "-c", "from broker import runtime; r = runtime.restore(); "
         "print(r.step, r.arrays['w'].tolist())"],
        env=env, capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "1 [0, 1, 2]"


def test_runtime_round_trip_returns_before_the_upload(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import runtime

    monkeypatch.setattr(runtime, "_ctx", [runtime.Context.from_env({
        "ONEPOOL_CHECKPOINT_URI": f"file://{tmp_path}/ck", "ONEPOOL_JOB_ID": "3"})])
    assert runtime.restore() is None
    fifo = tmp_path / "slow"
    os.mkfifo(fifo)
    model = tmp_path / "model"
    (model / "opt").mkdir(parents=True)
    (model / "weights.pt").write_bytes(b"W" * 100)
    (model / "opt" / "state.pt").write_bytes(b"S" * 10)
    pending = runtime.save(4, arrays={"w": np.ones(5)}, files={"note.txt": fifo, "ckpt": model})
    assert not pending.done()  # the upload waits on the FIFO; save() did not
    with open(fifo, "wb") as w:
        w.write(b"hi")
    runtime.wait()
    m = pending.result()
    assert m is not None and sorted(m.files) == [
        "arrays.npz", "ckpt/opt/state.pt", "ckpt/weights.pt", "note.txt"]
    r = runtime.restore()
    assert r is not None and r.step == 4
    assert np.array_equal(r.arrays["w"], np.ones(5)) and r.read("note.txt") == b"hi"
    assert r.read("ckpt/opt/state.pt") == b"S" * 10
    assert json.loads(r.store.fs.cat_file(r.store.step_path(4, MANIFEST)))["step"] == 4
    assert step_name(4) in r.manifest.uri

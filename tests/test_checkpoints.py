"""The checkpoint commit protocol on a local store: manifest last, partial folders ignored,
damaged ones skipped for the previous one, and a real process killed mid-save."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from broker.checkpoints import MANIFEST, CheckpointStore, job_prefix, step_name
from broker.errors import CheckpointError


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(job_prefix(f"file://{tmp_path}/ck", "team", "exp", 7))


def test_layout_and_manifest(store: CheckpointStore, tmp_path: Path) -> None:
    m = store.write(3, {"a.bin": b"hello", "sub/b.txt": b"x" * 10}, job_id=7, attempt=1,
                    written_by={"provider": "local", "region": "here"}, now=12.5)
    d = tmp_path / "ck" / "team" / "exp" / "7" / "step-000000000003"
    assert sorted(p.name for p in d.iterdir()) == ["a.bin", MANIFEST, "sub"]
    got = store.manifest(3)
    assert got is not None and got == m
    assert got.files["a.bin"].size == 5 and got.bytes == 15
    assert got.written_by == {"provider": "local", "region": "here"}
    assert store.verify(got) == []
    assert store.latest_valid() == (m, [])


def test_folder_without_manifest_is_not_a_checkpoint(store: CheckpointStore) -> None:
    store.write(1, {"w": b"one"}, now=1)
    store.fs.makedirs(store.root + "/" + step_name(5), exist_ok=True)
    store.fs.pipe_file(store.root + "/" + step_name(5) + "/w", b"half")
    assert store.steps() == [1, 5]
    assert [m.step for m in store.committed()] == [1]
    m, notes = store.latest_valid()
    assert m is not None and m.step == 1 and notes == []


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_damaged_checkpoint_falls_back(store: CheckpointStore, damage: str) -> None:
    store.write(1, {"w": b"one"}, now=1)
    store.write(2, {"w": b"two!"}, now=2)
    path = Path(store.root) / step_name(2) / "w"
    if damage == "flip":
        path.write_bytes(b"twO!")
    elif damage == "truncate":
        path.write_bytes(b"tw")
    else:
        path.unlink()
    m, notes = store.latest_valid()
    assert m is not None and m.step == 1
    assert len(notes) == 1 and "step 2 damaged" in notes[0]


def test_garbled_manifest_is_ignored(store: CheckpointStore) -> None:
    store.write(1, {"w": b"one"}, now=1)
    store.write(2, {"w": b"two"}, now=2)
    (Path(store.root) / step_name(2) / MANIFEST).write_text('{"format": 1, "st')
    assert [m.step for m in store.committed()] == [1]


@pytest.mark.parametrize("bad", ["", "/abs", "../up", "a/../../b", MANIFEST])
def test_bad_file_names_refused(store: CheckpointStore, bad: str) -> None:
    with pytest.raises(CheckpointError):
        store.write(1, {bad: b"x"}, now=0)


def test_committed_step_is_immutable(store: CheckpointStore) -> None:
    store.write(1, {"w": b"one"}, now=1)
    with pytest.raises(CheckpointError, match="already committed"):
        store.write(1, {"w": b"other"}, now=2)
    assert store.read(1, "w") == b"one"


SAVER = """
import sys
from broker import runtime
import numpy as np
runtime.save(1, arrays={"w": np.arange(3)}, block=True)
print("saved 1", flush=True)
runtime.save(2, files={"a.bin": sys.argv[1], "b.fifo": sys.argv[2]})
print("saving 2 in the background", flush=True)
runtime.wait()
"""


def test_process_killed_mid_save_leaves_previous_checkpoint(tmp_path: Path) -> None:
    """A real process is SIGKILLed while its second save is blocked reading a FIFO (after the
    first file of that step is written): restore() must return step 1, not the torn step 2."""
    uri = f"file://{tmp_path}/ck/t/e/1"
    (tmp_path / "a.bin").write_bytes(b"A" * 1000)
    fifo = tmp_path / "b.fifo"
    os.mkfifo(fifo)
    env = {**os.environ, "ONEPOOL_JOB_ID": "1", "ONEPOOL_ATTEMPT": "1",
           "ONEPOOL_CHECKPOINT_URI": uri}
    p = subprocess.Popen([sys.executable, "-c", SAVER, str(tmp_path / "a.bin"), str(fifo)],
                         env=env, stdout=subprocess.PIPE, cwd=Path(__file__).parent.parent)
    assert p.stdout is not None
    assert p.stdout.readline().strip() == b"saved 1"
    # Opening the FIFO for writing blocks until the saver opens it for reading: then the
    # saver is inside save(2), with a.bin already written and no manifest yet.
    with open(fifo, "wb") as w:
        w.write(b"partial")
        w.flush()
        store = CheckpointStore(uri)
        assert (Path(store.root) / step_name(2) / "a.bin").exists()
        p.send_signal(signal.SIGKILL)
        p.wait()
    store = CheckpointStore(uri)
    assert store.steps() == [1, 2]
    assert [m.step for m in store.committed()] == [1]
    out = subprocess.run(
        [sys.executable, "-c", "from broker import runtime; r = runtime.restore(); "
         "print(r.step, r.arrays['w'].tolist())"],
        env=env, capture_output=True, text=True, check=True,
        cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "1 [0, 1, 2]"


def test_runtime_arrays_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from broker import runtime

    monkeypatch.setattr(runtime, "_ctx", [runtime.Context.from_env({
        "ONEPOOL_CHECKPOINT_URI": f"file://{tmp_path}/ck", "ONEPOOL_JOB_ID": "3"})])
    assert runtime.restore() is None
    pending = runtime.save(4, arrays={"w": np.ones(5), "b": np.array([2.0])},
                           files={"note.txt": b"hi"})
    runtime.wait()
    assert pending.done() and pending.result() is not None
    r = runtime.restore()
    assert r is not None and r.step == 4
    assert np.array_equal(r.arrays["w"], np.ones(5)) and r.read("note.txt") == b"hi"

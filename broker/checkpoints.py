"""The normalized checkpoint layout in object storage, through fsspec.

Layout, per job::

    {store}/{team}/{experiment}/{job_id}/step-{step:012d}/
        <the checkpoint's files>
        manifest.json            written last: the commit

manifest.json holds the format version, step, time, attempt, where it was written
(provider, region), and for every file its size and sha256. A step folder without a
manifest is not a checkpoint (an upload cut off mid-write); one whose files do not match
their manifest is damaged, and readers fall back to the previous committed step.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from broker.errors import CheckpointError

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
STEP_PREFIX = "step-"
CHUNK = 1 << 20


def job_prefix(store: str, team: str, experiment: str, job_id: int) -> str:
    """The job's checkpoint prefix URI under a store root URI."""
    return f"{store.rstrip('/')}/{team}/{experiment}/{job_id}"


def step_name(step: int) -> str:
    if step < 0:
        raise CheckpointError(f"step must be >= 0 (got {step})")
    return f"{STEP_PREFIX}{step:012d}"


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    time: float
    job_id: int | None
    attempt: int | None
    written_by: dict[str, str]
    files: dict[str, FileEntry]
    format: int = FORMAT_VERSION
    uri: str = field(default="", compare=False)  # the step folder (not stored)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("uri")
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, uri: str) -> Manifest:
        d = json.loads(text)
        if d.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{uri}: unknown manifest format {d.get('format')!r}")
        files = {k: FileEntry(int(v["size"]), str(v["sha256"])) for k, v in d["files"].items()}
        return cls(step=int(d["step"]), time=float(d["time"]), job_id=d.get("job_id"),
                   attempt=d.get("attempt"), written_by=dict(d.get("written_by", {})),
                   files=files, uri=uri)


class CheckpointStore:
    """The checkpoints of one job, at one prefix URI (file://, s3://, gs://, memory://...)."""

    def __init__(self, prefix_uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.uri = prefix_uri.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.uri, **dict(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def step_uri(self, step: int) -> str:
        return f"{self.uri}/{step_name(step)}"

    def steps(self) -> list[int]:
        """Every step folder present (committed or not), ascending."""
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            base = posixpath.basename(n.rstrip("/"))
            if base.startswith(STEP_PREFIX) and base[len(STEP_PREFIX):].isdigit():
                out.append(int(base[len(STEP_PREFIX):]))
        return sorted(out)

    def manifest(self, step: int) -> Manifest | None:
        """The step's manifest, or None if it has none (not committed) or it is unreadable."""
        path = self._path(step_name(step), MANIFEST)
        try:
            text = self.fs.cat_file(path).decode()
            return Manifest.from_json(text, self.step_uri(step))
        except (FileNotFoundError, ValueError, KeyError, TypeError, CheckpointError):
            return None

    def committed(self, after: int | None = None) -> list[Manifest]:
        """Committed manifests, newest first (optionally only steps > after). Not verified."""
        out = []
        for s in reversed(self.steps()):
            if after is not None and s <= after:
                break
            m = self.manifest(s)
            if m is not None:
                out.append(m)
        return out

    def verify(self, m: Manifest) -> list[str]:
        """Problems with a committed checkpoint's files (empty list: intact)."""
        problems = []
        for name, entry in sorted(m.files.items()):
            path = self._path(step_name(m.step), name)
            try:
                h = hashlib.sha256()
                size = 0
                with self.fs.open(path, "rb") as f:
                    while chunk := f.read(CHUNK):
                        h.update(chunk)
                        size += len(chunk)
            except FileNotFoundError:
                problems.append(f"{name}: missing")
                continue
            if size != entry.size:
                problems.append(f"{name}: size {size} != {entry.size}")
            elif h.hexdigest() != entry.sha256:
                problems.append(f"{name}: sha256 mismatch")
        return problems

    def latest_valid(self, at_most: int | None = None) -> tuple[Manifest | None, list[str]]:
        """The newest committed checkpoint that verifies (optionally with step <= at_most), and
        a note per newer one skipped because it was damaged."""
        skipped = []
        for m in self.committed():
            if at_most is not None and m.step > at_most:
                continue
            problems = self.verify(m)
            if not problems:
                return m, skipped
            skipped.append(f"step {m.step} damaged ({'; '.join(problems)}), falling back")
        return None, skipped

    def write(
        self,
        step: int,
        files: Mapping[str, bytes | str | Path],
        *,
        job_id: int | None = None,
        attempt: int | None = None,
        written_by: Mapping[str, str] | None = None,
        now: float,
    ) -> Manifest:
        """Write the files (bytes, or a local path to copy), then commit the manifest last.

        A crash before the manifest leaves an uncommitted folder that readers ignore.
        Raises CheckpointError if the step is already committed (steps are immutable).
        """
        if not files:
            raise CheckpointError("a checkpoint needs at least one file")
        if self.manifest(step) is not None:
            raise CheckpointError(f"step {step} is already committed at {self.step_uri(step)}")
        d = self._path(step_name(step))
        self.fs.makedirs(d, exist_ok=True)
        entries: dict[str, FileEntry] = {}
        for name in sorted(files):
            _check_name(name)
            entries[name] = self._put(files[name], posixpath.join(d, name))
        m = Manifest(step=step, time=now, job_id=job_id, attempt=attempt,
                     written_by=dict(written_by or {}), files=entries, uri=self.step_uri(step))
        self._commit(posixpath.join(d, MANIFEST), m.to_json().encode())
        return m

    def _put(self, src: bytes | str | Path, dest: str) -> FileEntry:
        h = hashlib.sha256()
        size = 0
        self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
        with self.fs.open(dest, "wb") as out:
            for chunk in _chunks(src):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        return FileEntry(size, h.hexdigest())

    def _commit(self, path: str, data: bytes) -> None:
        if self.local:
            tmp = path + ".tmp"
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            Path(tmp).replace(path)
        else:
            self.fs.pipe_file(path, data)

    def read(self, step: int, name: str) -> bytes:
        _check_name(name)
        return self.fs.cat_file(self._path(step_name(step), name))

    def delete(self, step: int) -> None:
        """Delete a step folder (manifest first, so it is never seen half-deleted)."""
        d = self._path(step_name(step))
        if self.fs.exists(posixpath.join(d, MANIFEST)):
            self.fs.rm_file(posixpath.join(d, MANIFEST))
        if self.fs.exists(d):
            self.fs.rm(d, recursive=True)


def _check_name(name: str) -> None:
    if not name or name.startswith("/") or ".." in name.split("/") or name == MANIFEST:
        raise CheckpointError(f"bad checkpoint file name {name!r}")


def _chunks(src: bytes | str | Path) -> Iterable[bytes]:
    if isinstance(src, bytes | bytearray | memoryview):
        yield bytes(src)
        return
    with open(src, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk

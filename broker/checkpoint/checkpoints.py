"""The normalized checkpoint layout in object storage, through fsspec (file://, s3://, gs://).

Layout, per job::

    {store}/{team}/{experiment}/{job_id}/
        step-{step:012d}/
            <the checkpoint's files>          one writer (world size 1)
            rank-{r:05d}/<files>              multi-node: rank r's shard ...
            rank-{r:05d}.json                 ... and its marker (the shard's files, sizes, sha256)
            .manifest-{writer}.json           a commit in progress (ignored by readers)
            manifest.json                     THE COMMIT: written last
        _attempts/attempt-{n:05d}.json        attempt n's first new step (restart overhead)

manifest.json holds the format version, step, time, job, attempt, where it was written
(provider, region, pool), the world size, the writer's unique token, and for every file
its size and sha256. A step folder without a manifest is not a checkpoint (an upload cut
off mid-write); one whose files do not match their manifest is damaged, and readers fall
back to the previous committed step.

Commit protocol (correct with or without conditional writes):

1. Refuse if the step already has a manifest (committed steps are immutable).
2. Upload the files. For multi-node jobs every rank uploads its shard under `rank-{r}/`
   and then its marker; rank 0 commits only once every rank's marker is present, and the
   manifest lists every shard's files, so a checkpoint is consistent across nodes or absent.
3. Write the manifest under a name unique to this writer (`.manifest-{writer}.json`; on a
   local disk fsynced): a durable record of the intent that no other writer can touch.
4. Check again that no manifest appeared meanwhile (a concurrent writer finished first).
5. Promote: create `manifest.json` *create-only*: a hard link of the pending file on a
   local disk (atomic, fails if it exists), `If-None-Match: *` on S3, `ifGenerationMatch=0`
   on GCS. Object PUTs are atomic, so a reader sees the whole manifest or none.
6. Read `manifest.json` back and succeed only if it carries this writer's token; remove
   the pending file.

What each guarantee rests on:

- *Never resume from a partial or mixed checkpoint*: rests on nothing but the manifest
  being written after the files (1-5) and on checksums: a reader verifies every file's
  size and sha256 before use, so files overwritten by another writer, truncated uploads
  and bit rot are all caught, and the reader falls back to the previous committed step.
  This holds on any store, conditional writes or not.
- *At most one winner per step*: exact on stores that enforce create-only writes (the
  loser's promote fails). A store that ignores preconditions (some emulators, some
  S3-compatible stores) turns step 5 into last-writer-wins; step 4 then catches every
  writer that starts its commit after another one finished, step 6 catches a writer
  overwritten before its read-back, and two writers that promote in the same instant may
  both be told success while the step holds the last one's manifest: if their files mixed,
  the checksums mark the step damaged and readers skip it. Without a compare-and-swap no
  store protocol can do better; the broker keeps such races rare (one attempt of a job
  runs at a time, only rank 0 commits).
- *A crash anywhere is harmless*: before step 5 it leaves a folder without a manifest
  (ignored; deleted by retention after a safety delay); after it, a committed checkpoint.

Names are data (broker.checkpoint.names): every file name read from a manifest or a shard
marker is checked before it becomes a path, and on a local disk the path must not pass
through a symbolic link. A manifest with a bad name, a forged size or too many files is
damaged (`Manifest.problems` names the entry) and readers fall back to the previous step.
The broker's copies write each file aside and make it visible only once its size and
sha256 match (`put_verified`).

Filesystem objects are cached by fsspec; listings here always bypass the cache, so a
checkpoint written by another process is seen at once.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from broker.checkpoint.localdisk import confine, link_or_create, open_regular
from broker.checkpoint.manifest import FileEntry, Manifest, damaged
from broker.checkpoint.markers import ATTEMPTS_DIR as ATTEMPTS_DIR  # re-exported: where it is imported
from broker.checkpoint.markers import MAX_MARKER_BYTES as MAX_MARKER_BYTES
from broker.checkpoint.markers import ShardsAndMarkers, TooLarge
from broker.checkpoint.markers import shard_dir as shard_dir
from broker.checkpoint.names import (
    ASIDE_PREFIX,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    PENDING_PREFIX,
    BadName,
    check_files,
    check_name,
)
from broker.errors import CheckpointError

STEP_PREFIX = "step-"
MAX_STEP = 10**18 - 1  # a step folder with a larger number is not a checkpoint (int64 columns)
_STEP_RE = re.compile(r"step-([0-9]{1,18})")
CHUNK = 1 << 20

Source = bytes | str | Path
"""A file to write: its bytes, or the local path to read them from."""


def job_prefix(store: str, team: str, experiment: str, job_id: int) -> str:
    """The job's checkpoint prefix URI under a store root URI."""
    return f"{store.rstrip('/')}/{team}/{experiment}/{job_id}"


def store_root_of(prefix: str) -> str:
    """Inverse of job_prefix: the store root URI of a job prefix URI."""
    return prefix.rstrip("/").rsplit("/", 3)[0]


def step_name(step: int) -> str:
    if not 0 <= step <= MAX_STEP:
        raise CheckpointError(f"step must be from 0 to {MAX_STEP} (got {step})")
    return f"{STEP_PREFIX}{step:012d}"


def new_writer_token(*parts: object) -> str:
    """A token unique to one writer of one step."""
    return "-".join([*(str(p) for p in parts if p is not None), uuid.uuid4().hex[:12]])


class NotAsDeclared(CheckpointError):
    """A file written aside does not match the size and sha256 it was declared with; nothing
    was made visible under its name."""


class CheckpointStore(ShardsAndMarkers):
    """The checkpoints of one job, at one prefix URI (file://, s3://, gs://, memory://...).

    Credentials come from the provider's usual chain (environment, config files, instance
    roles); `storage_options` are for tests and special endpoints only. Multi-node shards and
    the attempts' markers: broker.checkpoint.markers.ShardsAndMarkers.
    """

    def __init__(self, prefix_uri: str, storage_options: Mapping[str, Any] | None = None) -> None:
        self.uri = prefix_uri.rstrip("/")
        self.fs, self.root = fsspec.core.url_to_fs(self.uri, **dict(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)

    def _path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def step_path(self, step: int, *parts: str) -> str:
        return self._path(step_name(step), *parts)

    def step_uri(self, step: int) -> str:
        return f"{self.uri}/{step_name(step)}"

    def file_path(self, step: int, name: str) -> str:
        """The path of file `name` of `step`, a name that came from a job: checked (see
        broker.checkpoint.names) and, on a local disk, refused if the path would pass through
        a symbolic link. Raises BadName."""
        path = self.step_path(step, check_name(name))
        if self.local:
            confine(self.root, path)
        return path

    def _exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    # -- reading ----------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """Every step folder present (committed or not), ascending."""
        self.fs.invalidate_cache(self.root)
        try:
            names = self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            return []
        out = []
        for n in names:
            hit = _STEP_RE.fullmatch(posixpath.basename(n.rstrip("/")))
            if hit:
                out.append(int(hit.group(1)))
        return sorted(set(out))

    def manifest(self, step: int) -> Manifest | None:
        """The step's manifest, or None if it has none (not committed) or it is unreadable.

        A manifest larger than MAX_MANIFEST_BYTES, or whose step is not its folder's, or whose
        file list breaks the rules, is returned damaged: no files, `problems` saying why."""
        uri = self.step_uri(step)
        try:
            if self.local:
                confine(self.root, self.step_path(step, MANIFEST))
            text = self._read_small(self.step_path(step, MANIFEST), MAX_MANIFEST_BYTES)
            m = Manifest.from_json(text.decode(), uri)
        except BadName as e:
            return damaged(step, uri, str(e))
        except TooLarge:
            return damaged(step, uri, f"{MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
        except (FileNotFoundError, ValueError, KeyError, TypeError, CheckpointError):
            return None
        if m.step != step:
            return damaged(step, uri, f"{MANIFEST} says step {m.step} in the folder of step {step}")
        return m

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

    def open_read(self, path: str) -> Any:
        """Open a stored file for reading. On a local disk the file must be a regular one, not
        reached through a final symbolic link (open_regular: a job's FIFO or device raises
        BadName instead of blocking the reader). Raises FileNotFoundError."""
        if self.local:
            return open_regular(path)
        return self.fs.open(path, "rb")

    def hash_file(self, path: str, limit: int | None = None) -> FileEntry:
        """Size and sha256 of one stored file. With `limit`, reading stops past `limit` bytes
        (the size returned is then larger than `limit`, the hash partial): a file a job made
        larger than it declared costs no more than its declared size. Raises
        FileNotFoundError, BadName (see open_read)."""
        h = hashlib.sha256()
        size = 0
        with self.open_read(path) as f:
            if self.local and limit is not None and (real := os.fstat(f.fileno()).st_size) > limit:
                return FileEntry(real, "")  # sparse or huge: not read at all
            while chunk := f.read(CHUNK):
                h.update(chunk)
                size += len(chunk)
                if limit is not None and size > limit:
                    break
        return FileEntry(size, h.hexdigest())

    def verify(self, m: Manifest) -> list[str]:
        """Problems with a committed checkpoint's files (empty list: intact)."""
        if m.problems:
            return list(m.problems)
        problems = []
        for name, entry in sorted(m.files.items()):
            try:
                got = self.hash_file(self.file_path(m.step, name), limit=entry.size)
            except BadName as e:
                problems.append(str(e))
                continue
            except FileNotFoundError:
                problems.append(f"{name}: missing")
                continue
            if got.size != entry.size:
                problems.append(f"{name}: size {got.size} != {entry.size}")
            elif got.sha256 != entry.sha256:
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

    def read(self, step: int, name: str) -> bytes:
        """The bytes of one file. Raises BadName (see file_path) or FileNotFoundError."""
        return bytes(self.fs.cat_file(self.file_path(step, name)))

    # -- writing ----------------------------------------------------------------------------
    def write(self, step: int, files: Mapping[str, Source], *, job_id: int | None = None,
              attempt: int | None = None, written_by: Mapping[str, str] | None = None,
              now: float, started: float | None = None) -> Manifest:
        """Write the files (bytes, or a local path to copy), then commit the manifest last.

        A crash before the commit leaves an uncommitted folder that readers ignore.
        Raises CheckpointError if the step is already committed (steps are immutable) or
        another writer committed it first. `started` (the writer's clock when its save began)
        records the save's duration in the manifest (`save_s`).
        """
        if not files:
            raise CheckpointError("a checkpoint needs at least one file")
        self._refuse_committed(step)
        entries = self.put_files(step, files)
        return self.commit(step, entries, job_id=job_id, attempt=attempt,
                           written_by=written_by, now=now, started=started)

    def put_files(self, step: int, files: Mapping[str, Source], under: str = "") -> dict[str, FileEntry]:
        """Upload files into the step folder (optionally under a sub-folder); their entries."""
        entries: dict[str, FileEntry] = {}
        for name in sorted(files):
            rel = posixpath.join(under, name) if under else name
            entries[rel] = self._put(files[name], self.file_path(step, rel))
        return entries

    def put_verified(self, step: int, name: str, entry: FileEntry, fill: Callable[[str], None]) -> None:
        """Write file `name` of `step` so that it becomes visible only with the size and sha256
        of `entry`: `fill(path)` writes the bytes to a path aside (a `.onepool-` name in the
        same folder, on this store), which is read back and checked, then renamed (a local
        disk) or copied server-side (an object store) to its name. Raises BadName,
        NotAsDeclared (nothing is left under the name or aside) or what `fill` raises."""
        final = self.file_path(step, name)
        folder = posixpath.dirname(final)
        aside = posixpath.join(folder, f"{ASIDE_PREFIX}{uuid.uuid4().hex}.part")
        self.fs.makedirs(folder, exist_ok=True)
        try:
            if self.local:
                confine(self.root, aside)
            fill(aside)
            got = self.hash_file(aside, limit=entry.size)
            if got != entry:
                raise NotAsDeclared(f"{name}: wrote {got.size} bytes (sha256 {got.sha256[:12]}...), "
                                    f"expected {entry.size} (sha256 {entry.sha256[:12]}...)")
            if self.local:
                confine(self.root, final)
                os.replace(aside, final)
            else:
                self.fs.cp_file(aside, final)
        finally:
            if self._exists(aside):
                self.fs.rm_file(aside)

    def _put(self, src: Source, dest: str) -> FileEntry:
        h = hashlib.sha256()
        size = 0
        self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
        with self.fs.open(dest, "wb") as out:
            for chunk in _chunks(src):
                h.update(chunk)
                size += len(chunk)
                out.write(chunk)
        return FileEntry(size, h.hexdigest())

    def _refuse_committed(self, step: int) -> None:
        if self._exists(self.step_path(step, MANIFEST)):
            raise CheckpointError(f"step {step} is already committed at {self.step_uri(step)}; "
                                  "committed steps are immutable: save a later step")

    def commit(self, step: int, entries: Mapping[str, FileEntry], *, now: float,
               job_id: int | None = None, attempt: int | None = None,
               written_by: Mapping[str, str] | None = None, world_size: int = 1,
               copied_from: str | None = None, started: float | None = None) -> Manifest:
        """Commit already-uploaded files as step `step` (see the module docstring, steps 3-6).

        Raises CheckpointError if the step is committed already or another writer won.
        """
        if not entries:
            raise CheckpointError("a checkpoint needs at least one file")
        check_files((k, asdict(v)) for k, v in entries.items())
        m = Manifest(step=step, time=now, job_id=job_id, attempt=attempt,
                     written_by=dict(written_by or {}), files=dict(entries),
                     world_size=world_size, writer=new_writer_token(job_id, attempt),
                     copied_from=copied_from, uri=self.step_uri(step),
                     save_s=None if started is None else max(0.0, now - started))
        body = m.to_json().encode()
        final = self.step_path(step, MANIFEST)
        pending = self.step_path(step, f"{PENDING_PREFIX}{m.writer}.json")
        self._write_durable(pending, body)
        try:
            self._refuse_committed(step)
            self._create_only(pending, final, body)
            got = self.manifest(step)
        finally:
            self.fs.rm_file(pending)
        if got is None or got.writer != m.writer:
            raise CheckpointError(f"step {step} at {self.step_uri(step)} was committed by another "
                                  "writer at the same time; this save did not take effect")
        return m

    def _write_durable(self, path: str, data: bytes) -> None:
        if self.local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        else:
            self.fs.pipe_file(path, data)

    def _create_only(self, pending: str, final: str, data: bytes) -> None:
        try:
            if self.local:
                link_or_create(pending, final, data)
            else:
                self.fs.pipe_file(final, data, mode="create")
        except FileExistsError:
            raise CheckpointError(f"{final} already exists: another writer committed this step "
                                  "first; this save did not take effect") from None

    def _read_small(self, path: str, limit: int) -> bytes:
        """A file a job wrote, read whole only if it holds at most `limit` bytes (a job cannot
        make the broker read without end). Raises TooLarge or FileNotFoundError."""
        with self.open_read(path) as f:
            data = bytes(f.read(limit + 1))
        if len(data) > limit:
            raise TooLarge(f"{path} is larger than {limit} bytes")
        return data

    # -- deleting ---------------------------------------------------------------------------
    def delete(self, step: int) -> None:
        """Delete a step folder (manifest first, so it is never seen half-deleted). On a local
        disk, refuses (BadName) a step folder reached through a symbolic link."""
        final = self.step_path(step, MANIFEST)
        if self.local:
            confine(self.root, self.step_path(step))
        if self._exists(final):
            self.fs.rm_file(final)
        d = self.step_path(step)
        if self._exists(d):
            self.fs.rm(d, recursive=True)
        self.fs.invalidate_cache(d)


def _chunks(src: Source) -> Iterable[bytes]:
    if isinstance(src, bytes | bytearray | memoryview):
        yield bytes(src)
        return
    with open(src, "rb") as f:
        while chunk := f.read(CHUNK):
            yield chunk

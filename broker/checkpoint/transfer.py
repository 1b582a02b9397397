"""Copy a committed checkpoint from one store to another, verified, with retries.

`copy_checkpoint(src, manifest, dst)` promises: when it returns, `dst` holds the same step,
committed with the same files, and every file there matches the source manifest's size and
sha256. The manifest was written by a job, so it is untrusted: a manifest whose names or
sizes break the rules of broker.checkpoint.names is refused as damaged before anything is
written. Files go server-side when both stores are one filesystem (S3 to S3, GCS to GCS,
disk to disk), else streamed through this process in 1 MiB chunks, hashing on the way (a
source larger than declared is cut off at once). Each file is written aside and becomes
visible under its name only once its size and sha256, read back at the destination, match
(`CheckpointStore.put_verified`). Transient failures (OSError: resets, timeouts,
throttling) are retried per file with exponential backoff (tenacity). The destination
manifest is committed last, once every file verified, with the checkpoints module's
protocol, so a copy cut off midway is just an uncommitted folder.

Raises SourceDamaged (the source does not match its manifest, or the manifest breaks the
rules: fall back to an older checkpoint) or CopyFailed (the destination could not be
written or verified after the retries; the destination folder is removed).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from broker.checkpoint.checkpoints import CHUNK, CheckpointStore, FileEntry, Manifest, NotAsDeclared
from broker.checkpoint.names import BadName
from broker.crashpoints import crash_point
from broker.errors import CheckpointError

log = logging.getLogger("onepool.transfer")
TRIES = 4


class SourceDamaged(CheckpointError):
    """The source checkpoint does not match its manifest: use an older one."""


class CopyFailed(CheckpointError):
    """The copy could not be completed or verified; the destination holds no such step."""


@dataclass(frozen=True)
class CopyResult:
    step: int
    bytes: int  # bytes that crossed between the stores (0: the step was there already)
    server_side: bool
    manifest: Manifest


def same_filesystem(a: CheckpointStore, b: CheckpointStore) -> bool:
    """Whether one filesystem object reaches both stores (so it can copy server-side)."""
    return a.fs is b.fs


def copy_checkpoint(src: CheckpointStore, m: Manifest, dst: CheckpointStore, *, now: float,
                    tries: int = TRIES) -> CopyResult:
    """Copy step `m.step` from `src` to `dst` (see the module docstring)."""
    if m.problems:
        raise SourceDamaged("; ".join(m.problems))
    for name in m.files:  # every source name checked before anything is written
        _source_path(src, m.step, name)
    there = dst.manifest(m.step)
    if there is not None:
        if there.files == m.files and not dst.verify(there):
            return CopyResult(m.step, 0, False, there)
        log.info("step %s at %s is damaged or differs; replacing it", m.step, dst.uri)
    server_side = same_filesystem(src, dst)
    copy_one = _retrying(tries)(_server_copy if server_side else _stream_copy)
    try:
        dst.delete(m.step)  # a partial or damaged earlier copy: start clean
        for name, entry in sorted(m.files.items()):
            crash_point("checkpoint_copy")
            copy_one(src, dst, m.step, name, entry)
        out = dst.commit(m.step, m.files, now=now, job_id=m.job_id, attempt=m.attempt,
                         written_by=m.written_by, world_size=m.world_size, copied_from=m.uri)
    except SourceDamaged:
        _clean(dst, m.step)
        raise
    except (OSError, CheckpointError) as e:
        _clean(dst, m.step)
        raise CopyFailed(f"copying step {m.step} from {src.uri} to {dst.uri} failed after "
                         f"{tries} tries: {e}") from e
    return CopyResult(m.step, m.bytes, server_side, out)


def _clean(dst: CheckpointStore, step: int) -> None:
    """Remove what a failed copy left; a failure to do so is logged (retention retries it), as
    the copy's own error is the one to raise."""
    try:
        dst.delete(step)
    except (OSError, CheckpointError) as e:
        log.warning("cannot remove the failed copy of step %s at %s (%s)", step, dst.uri, e)


def _retrying(tries: int):  # type: ignore[no-untyped-def]
    return retry(retry=retry_if_exception_type(OSError), stop=stop_after_attempt(tries),
                 wait=wait_exponential(multiplier=0.05, max=2.0), reraise=True)


def _server_copy(src: CheckpointStore, dst: CheckpointStore, step: int, name: str,
                 entry: FileEntry) -> None:
    """Copy one file within one filesystem; a copy that does not match the manifest means the
    source does not (the copy is exact)."""
    source = _source_path(src, step, name)
    try:
        size = src.fs.size(source)
        if size != entry.size:  # caught before copying, so a forged size copies nothing
            raise SourceDamaged(f"step {step}: {name} at {src.uri} does not match its manifest "
                                f"({size} bytes, expected {entry.size})")
        dst.put_verified(step, name, entry, lambda aside: dst.fs.cp_file(source, aside))
    except FileNotFoundError:
        raise SourceDamaged(f"step {step}: {name} is missing at {src.uri}") from None
    except NotAsDeclared as e:
        raise SourceDamaged(f"step {step} at {src.uri} does not match its manifest: {e}") from None


def _stream_copy(src: CheckpointStore, dst: CheckpointStore, step: int, name: str,
                 entry: FileEntry) -> None:
    """Stream one file through this process, hashing the source on the way; a read-back that
    then differs is the destination's fault (CopyFailed after the retries)."""
    source = _source_path(src, step, name)

    def fill(aside: str) -> None:
        h = hashlib.sha256()
        size = 0
        try:
            reader = src.open_read(source)
        except BadName as e:  # a FIFO, a device or a link put there since it was verified
            raise SourceDamaged(f"step {step}: {name} at {src.uri}: {e}") from None
        with reader as r, dst.fs.open(aside, "wb") as w:
            while chunk := r.read(CHUNK):
                size += len(chunk)
                if size > entry.size:
                    raise SourceDamaged(f"step {step}: {name} at {src.uri} is larger than the "
                                        f"{entry.size} bytes its manifest says")
                h.update(chunk)
                w.write(chunk)
        if size != entry.size or h.hexdigest() != entry.sha256:
            raise SourceDamaged(f"step {step}: {name} at {src.uri} does not match its manifest "
                                f"({size} bytes, expected {entry.size})")

    try:
        dst.put_verified(step, name, entry, fill)
    except FileNotFoundError:
        raise SourceDamaged(f"step {step}: {name} is missing at {src.uri}") from None


def _source_path(src: CheckpointStore, step: int, name: str) -> str:
    try:
        return src.file_path(step, name)
    except BadName as e:
        raise SourceDamaged(str(e)) from None

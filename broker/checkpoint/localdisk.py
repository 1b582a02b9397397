"""Checkpoint stores on a local disk: paths that stay where they are named, and atomic creates.

A job that can write its own checkpoint folder on a disk the broker also uses can put a
symbolic link where the broker expects a file or a folder (`step-5 -> /etc`). `confine`
refuses any path below a store's folder whose real path differs from its name: the broker
then neither reads a file outside the store as if it were the job's, nor writes or deletes
through a link.
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path
from typing import BinaryIO

from broker.checkpoint.names import BadName

JOB_DEPTH = 3
"""A job's folder is `{store}/{team}/{experiment}/{job_id}`: its store's folder is 3 levels up."""


def confine(job_root: str, path: str) -> None:
    """Raise BadName unless `path` lies below `job_root` (a job's checkpoint folder) and no part
    of it below the store's folder (JOB_DEPTH levels above `job_root`) is a symbolic link.
    Parts that do not exist yet pass (they are created by the caller, as plain folders)."""
    anchor = os.path.abspath(job_root)
    for _ in range(JOB_DEPTH):
        anchor = os.path.dirname(anchor)
    target = os.path.abspath(path)
    if os.path.commonpath([os.path.abspath(job_root), target]) != os.path.abspath(job_root):
        raise BadName(f"{path} is outside the job's checkpoint folder {job_root}: refused")
    expected = os.path.join(os.path.realpath(anchor), os.path.relpath(target, anchor))
    real = os.path.realpath(target)
    if real != expected:
        raise BadName(f"{path} passes through a symbolic link (it leads to {real}): refused")


def open_regular(path: str) -> BinaryIO:
    """Open `path` for reading only if it is a regular file reached without a symbolic link as
    its last part. A job can put a FIFO where the broker reads (a read would wait for a writer
    without end, and stall whoever reads: the leader) or a link to a device: both raise BadName
    without blocking (O_NONBLOCK for the open, cleared once the file is known to be regular).
    Raises FileNotFoundError when nothing is there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise BadName(f"{path} cannot be opened as a plain file ({e.strerror}): refused") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise BadName(f"{path} is not a regular file (mode {stat.filemode(mode)}): refused")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def link_or_create(pending: str, final: str, data: bytes) -> None:
    """Create `final` with `data`, failing with FileExistsError if it exists: a hard link of
    the fsynced pending file (atomic), or, on filesystems without hard links, an exclusive
    create (a reader may then catch it half-written: it fails to parse and counts as not
    committed until complete)."""
    try:
        os.link(pending, final)
    except FileExistsError:
        raise
    except OSError:
        with open(final, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    fsync_dir(Path(final).parent)


def fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

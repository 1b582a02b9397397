"""Names that come from jobs are data, never paths: the one check every checkpoint path goes through.

A job writes its checkpoint's manifest, its shard markers and its files' names, and a hostile
job can write anything there. The broker uses those names on other stores and other machines
(copies across stores, restores, verification, retention), so every name is checked here,
wherever it is used, by `check_name` (one name) and `check_files` (a manifest's whole list).

A file name (relative to its step folder) is accepted only if it is:

- a non-empty string of at most MAX_NAME_BYTES bytes (UTF-8), each `/`-separated component
  at most MAX_COMPONENT_BYTES bytes;
- relative: no leading `/`, no drive part (`C:`), no backslash;
- free of NUL and other control characters, and of `*?[]` (fsspec reads them as patterns);
- made of non-empty components that are not `.` or `..` (so it equals its own normal form
  and resolves below the step folder);
- not a name the broker reserves: `manifest.json` at the top, a component starting with
  `.manifest-` (a commit in progress) or `.onepool-` (a file being written aside).

A manifest's list is accepted only if every name is, no name appears twice, no name is a
folder of another (`a` and `a/b`: one store could hold both, a disk cannot), it holds at
most MAX_FILES files, every size is an integer in [0, MAX_FILE_BYTES], the sizes add up to
at most MAX_TOTAL_BYTES, and every sha256 is 64 lowercase hex digits. A manifest that fails
is damaged: readers skip it for the previous committed step, naming the bad entry.

The limits are generous for real training state (a 5 TiB file is S3's largest object) and
small enough that a forged manifest cannot make the broker list, allocate or copy without end.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from typing import Any

from broker.errors import CheckpointError

MANIFEST = "manifest.json"
PENDING_PREFIX = ".manifest-"
ASIDE_PREFIX = ".onepool-"
MAX_NAME_BYTES = 1024
MAX_COMPONENT_BYTES = 255
MAX_FILES = 100_000
MAX_FILE_BYTES = 5 << 40  # 5 TiB
MAX_TOTAL_BYTES = 100 << 40  # 100 TiB
MAX_MANIFEST_BYTES = 64 << 20  # a manifest of MAX_FILES long names fits
_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f\\*?\[\]]")
_DRIVE = re.compile(r"^[A-Za-z]:")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

RULES = ("a relative path of non-empty components separated by '/', without '.', '..', a "
         "leading '/', a drive ('C:'), backslashes, control characters or '*?[]', and not "
         f"{MANIFEST!r} or a component starting with {PENDING_PREFIX!r} or {ASIDE_PREFIX!r}")


class BadName(CheckpointError):
    """A checkpoint file name (or a manifest's file list) breaks the rules above: the checkpoint
    holding it is damaged; use an older one, or save under a name that follows the rules."""


def check_name(name: object) -> str:
    """Return `name` if it is a safe checkpoint file name (see the module docstring), else raise
    BadName saying which rule it breaks."""
    if not isinstance(name, str):
        raise BadName(f"bad checkpoint file name {name!r}: not a string")
    why = _why_bad(name)
    if why:
        raise BadName(f"bad checkpoint file name {name!r}: {why}; a name must be {RULES}")
    return name


def _why_bad(name: str) -> str | None:
    if not name:
        return "empty"
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return "not valid UTF-8 (a lone surrogate)"
    if size > MAX_NAME_BYTES:
        return f"{size} bytes long (at most {MAX_NAME_BYTES})"
    bad = _FORBIDDEN.search(name)
    if bad:
        return f"holds {bad.group()!r}"
    if name.startswith("/"):
        return "is absolute"
    if _DRIVE.match(name):
        return "has a drive part"
    parts = name.split("/")
    for part in parts:
        if part in ("", ".", ".."):
            return f"has a {part!r} component" if part else "has an empty component"
        if len(part.encode()) > MAX_COMPONENT_BYTES:
            return f"has a component longer than {MAX_COMPONENT_BYTES} bytes"
        if part.startswith((PENDING_PREFIX, ASIDE_PREFIX)):
            return f"uses a reserved prefix ({PENDING_PREFIX!r}, {ASIDE_PREFIX!r})"
    if name == MANIFEST:
        return "is the manifest's own name"
    normal = posixpath.normpath(name)
    if normal != name or normal.startswith("../"):  # implied by the rules above; kept as a last guard
        return "does not resolve below its step folder"
    return None


def check_files(pairs: Iterable[tuple[Any, Any]]) -> dict[str, tuple[int, str]]:
    """Check a manifest's (or a shard marker's) file list, given as its (name, entry) pairs in
    the order written (so a name written twice is seen). Each entry is {"size", "sha256"}.
    Returns {name: (size, sha256)}; raises BadName naming the first bad entry."""
    out: dict[str, tuple[int, str]] = {}
    total = 0
    for i, (name, entry) in enumerate(pairs):
        if i >= MAX_FILES:
            raise BadName(f"more than {MAX_FILES} files listed: refused")
        check_name(name)
        if name in out:
            raise BadName(f"file {name!r} is listed twice")
        size, digest = _entry(name, entry)
        total += size
        if total > MAX_TOTAL_BYTES:
            raise BadName(f"the files add up to more than {MAX_TOTAL_BYTES} bytes: refused")
        out[name] = (size, digest)
    _no_file_is_a_folder(out)
    return out


def _entry(name: str, entry: Any) -> tuple[int, str]:
    if not isinstance(entry, dict):
        raise BadName(f"file {name!r}: entry must be {{'size': int, 'sha256': hex}}")
    size, digest = entry.get("size"), entry.get("sha256")
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        raise BadName(f"file {name!r}: size {size!r} must be an integer from 0 to {MAX_FILE_BYTES}")
    if not isinstance(digest, str) or not _SHA256.match(digest):
        raise BadName(f"file {name!r}: sha256 {digest!r} must be 64 lowercase hex digits")
    return size, digest


def _no_file_is_a_folder(names: Iterable[str]) -> None:
    present = set(names)
    for name in sorted(present):
        parts = name.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in present:
                raise BadName(f"file {folder!r} is also a folder of {name!r}")

"""Code snapshots (issue 26, part 1): the submit folder packed into one deterministic archive,
named by its sha256, that any node fetches, verifies and unpacks.

What is packed: in a git work tree, the files `git ls-files --cached --others
--exclude-standard` lists (tracked, plus untracked but not ignored); elsewhere, and when git
ignores the folder itself (one asked for by name, e.g. under an ignored build folder), every
regular file under the folder. A folder with nothing to pack is refused (EmptySnapshot).
Then the patterns of the folder's `.onepoolignore` (gitignore syntax,
matched by the pathspec library) are left out, and so is `.git/`. Symbolic links are packed as
links only when they point inside the folder; others are left out (a node would not have
their target).

The archive is deterministic: a gzip'd POSIX tar, entries sorted by path, every mtime 0,
owner 0:0 with no names, modes 0644 or 0755 (executable bit kept), gzip header without a
name or time. The same files give the same bytes, hence the same digest, on any machine: a
sweep of 100 jobs from one folder uploads once.

Unpacking treats the archive as hostile (it may come from any store): only regular files,
folders and links that stay inside; no absolute path, no `..`, no device or fifo, names
checked with broker.checkpoint.names' rules where they fit; tarfile's `data` filter on top.

This module uses the standard library and pathspec only: the thin client (`pip install
onepool`) packs, nodes unpack.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import posixpath
import re
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pathspec

# -- a spec's `code` value (broker.spec_code validates with it; the thin client packs with it) --
NONE = "none"
HELP = ("none, a folder to pack (e.g. `.`), sha256:<64 hex digits> (a snapshot uploaded already), "
        "or the URI of a prepared archive with its digest (s3://bucket/code.tar.gz#sha256=<64 hex digits>)")
_SHA = re.compile(r"^sha256:([0-9a-f]{64})$")
_URI = re.compile(r"^([a-z][a-z0-9+.-]*)://(.+)#sha256=([0-9a-f]{64})$")
URI_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "http", "https")


@dataclass(frozen=True)
class CodeRef:
    """A parsed `code` value: `kind` is none, folder, snapshot or archive."""

    kind: str
    sha256: str | None = None
    uri: str | None = None  # archive: where it is; folder: the path
    folder: str | None = None


def parse_code(v: str) -> CodeRef:
    """Parse a `code` value. Raises ValueError naming the allowed forms."""
    if v == NONE:
        return CodeRef(NONE)
    if v.startswith("sha256:"):
        m = _SHA.match(v)
        if m is None:
            raise ValueError(f"must be {HELP} (got {v!r}: a sha256 is 64 lowercase hex digits)")
        return CodeRef("snapshot", sha256=m.group(1))
    if "://" in v:
        m = _URI.match(v)
        if m is None:
            raise ValueError(f"must be {HELP} (got {v!r}: an archive's URI ends with "
                             "#sha256=<64 hex digits>, which nodes check it against)")
        if m.group(1) not in URI_SCHEMES:
            raise ValueError(f"the archive's scheme must be one of {', '.join(URI_SCHEMES)} "
                             f"(got {m.group(1)!r})")
        return CodeRef("archive", sha256=m.group(3), uri=v.rsplit("#", 1)[0])
    if not v.strip() or "\x00" in v:
        raise ValueError(f"must be {HELP} (got {v!r})")
    return CodeRef("folder", folder=v)

IGNORE_FILE = ".onepoolignore"
SHA_ENV = "ONEPOOL_CODE_SHA256"  # a rank's snapshot: its digest, and where a node fetches it
URI_ENV = "ONEPOOL_CODE_URI"
DEFAULT_LIMIT = 200 * 1024 * 1024  # bytes of files in one snapshot (before compression)
DIGEST = re.compile(r"^[0-9a-f]{64}$")
LARGEST_SHOWN = 5


def relative_to_file(v: object, spec_file: str | os.PathLike[str]) -> object:
    """A `code` value read from the job YAML at `spec_file`: a relative folder (`.`, `src`) is
    that file's folder, or below it, not the current one (a YAML names what sits beside it);
    anything else unchanged (an absolute or `~` folder, none, a snapshot, an archive, a value
    that is not a `code` form, which validation then refuses)."""
    if not isinstance(v, str):
        return v
    try:
        ref = parse_code(v)
    except ValueError:
        return v
    if ref.kind != "folder" or ref.folder is None or os.path.isabs(os.path.expanduser(ref.folder)):
        return v
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(spec_file)), ref.folder))



class EmptySnapshot(ValueError):
    """Nothing in the folder is packed (every file excluded by `.onepoolignore`, or no file):
    name the folder the code is in, or submit with `code: none`."""

    def __init__(self, folder: str) -> None:
        super().__init__(f"code: the folder {folder} holds no file to pack (none, or all excluded by "
                         f"{IGNORE_FILE}); give the folder the job's code is in")


class SnapshotTooLarge(ValueError):
    """The folder's files add up to more than the limit: exclude some (`.onepoolignore`), or
    submit with `code: none` and a shared `workdir`. The message names the largest files."""

    def __init__(self, folder: str, total: int, limit: int, largest: list[tuple[str, int]]) -> None:
        shown = ", ".join(f"{p} ({_mib(n)})" for p, n in largest)
        super().__init__(
            f"code: the folder {folder} holds {_mib(total)} of files to pack, above the limit of "
            f"{_mib(limit)}; the largest: {shown}. Exclude what the job does not need by adding "
            f"patterns to {IGNORE_FILE} in that folder (gitignore syntax, e.g. `data/` or `*.ckpt`), "
            "or submit with `--code none` and a `--workdir` every node shares")
        self.total, self.limit, self.largest = total, limit, largest


class BadArchive(ValueError):
    """An archive that does not unpack safely (a path outside its folder, a device, a link
    escaping, not a tar at all). Fetching it again will not help unless the copy was damaged."""


@dataclass(frozen=True)
class Snapshot:
    """A packed folder: its archive bytes, their sha256 (hex), and what went in."""

    data: bytes
    sha256: str
    files: int
    file_bytes: int

    @property
    def ref(self) -> str:
        """The job spec's `code` value naming this snapshot."""
        return f"sha256:{self.sha256}"


def _mib(n: int) -> str:
    return f"{n / 1048576:.1f} MiB"


def _git_files(folder: Path) -> list[str] | None:
    """The git-aware file list of `folder`, relative to it; None when it is not in a git work
    tree (or git is missing)."""
    try:
        inside = subprocess.run(["git", "-C", str(folder), "rev-parse", "--is-inside-work-tree"],
                                capture_output=True, text=True, timeout=30)
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        if subprocess.run(["git", "-C", str(folder), "check-ignore", "-q", "."],
                          capture_output=True, timeout=30).returncode == 0:
            return None  # git ignores the folder itself: the user named it, so it is packed whole
        out = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard", "--", "."], capture_output=True, timeout=120, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return sorted({p for p in out.stdout.decode("utf-8", "surrogateescape").split("\0") if p})


def _walk(folder: Path) -> list[str]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if d != ".git" and not os.path.islink(os.path.join(root, d))]
        rel = os.path.relpath(root, folder)
        out += [f if rel == "." else f"{rel}/{f}" for f in files]
        out += [d if rel == "." else f"{rel}/{d}" for d in os.listdir(root)
                if os.path.islink(os.path.join(root, d)) and os.path.isdir(os.path.join(root, d))]
    return sorted(out)


def file_list(folder: str | os.PathLike[str]) -> list[str]:
    """The paths (relative, '/'-separated, sorted) a snapshot of `folder` holds."""
    base = Path(folder)
    names = _git_files(base)
    if names is None:
        names = _walk(base)
    ignore = base / IGNORE_FILE
    spec = pathspec.GitIgnoreSpec.from_lines(ignore.read_text().splitlines()) if ignore.is_file() else None
    kept = []
    for n in names:
        if n == ".git" or n.startswith(".git/") or (spec is not None and spec.match_file(n)):
            continue
        p = base / n
        if p.is_symlink():
            if not _link_inside(base, p):
                continue
        elif not p.is_file():  # gone since git listed it, a socket, a submodule's folder
            continue
        kept.append(n)
    return kept


def _link_inside(base: Path, link: Path) -> bool:
    """Whether a link's target (relative, resolved without following links) stays in `base`."""
    t = os.readlink(link)
    if os.path.isabs(t):
        return False
    target = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(link)), t))
    root = os.path.abspath(base)
    return target.startswith(root + os.sep)


def pack(folder: str | os.PathLike[str], limit: int = DEFAULT_LIMIT) -> Snapshot:
    """Pack `folder` (see the module's doc). Raises SnapshotTooLarge (before reading any file)
    when its files add up to more than `limit` bytes, EmptySnapshot when none is packed,
    NotADirectoryError when it is no folder."""
    base = Path(folder)
    if not base.is_dir():
        raise NotADirectoryError(f"code: {str(base)!r} is not a folder to pack")
    names = file_list(base)
    if not names:
        raise EmptySnapshot(str(base))
    sizes = {n: (0 if (base / n).is_symlink() else (base / n).stat().st_size) for n in names}
    total = sum(sizes.values())
    if total > limit:
        largest = sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:LARGEST_SHOWN]
        raise SnapshotTooLarge(str(base), total, limit, largest)
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in _parents(names):
            tar.addfile(_info(d, tarfile.DIRTYPE, 0o755))
        for n in names:
            p = base / n
            if p.is_symlink():
                ti = _info(n, tarfile.SYMTYPE, 0o777)
                ti.linkname = os.readlink(p)
                tar.addfile(ti)
                continue
            mode = 0o755 if os.access(p, os.X_OK) else 0o644
            with open(p, "rb") as f:
                data = f.read()
            ti = _info(n, tarfile.REGTYPE, mode)
            ti.size = len(data)
            tar.addfile(ti, io.BytesIO(data))
    out = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as gz:
        gz.write(raw.getvalue())
    data = out.getvalue()
    return Snapshot(data, hashlib.sha256(data).hexdigest(), len(names), total)


def _parents(names: Iterable[str]) -> list[str]:
    dirs: set[str] = set()
    for n in names:
        parts = PurePosixPath(n).parts[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return sorted(dirs)


def _info(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.mtime = kind, mode, 0
    ti.uid = ti.gid = 0
    ti.uname = ti.gname = ""
    return ti


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_member(m: tarfile.TarInfo) -> None:
    """Raise BadArchive unless `m` is a regular file, a folder or a relative link that stays
    inside the archive's folder, under a relative name without `..`."""
    name = m.name
    parts = PurePosixPath(name).parts
    if not name or name.startswith("/") or "\\" in name or "\x00" in name or ".." in parts:
        raise BadArchive(f"the archive holds an entry outside its folder: {name!r}")
    if len(name.encode()) > 4096 or any(len(p.encode()) > 255 for p in parts):
        raise BadArchive(f"the archive holds a name too long for a filesystem: {name[:80]!r}...")
    if m.issym():
        target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
        if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
            raise BadArchive(f"the archive holds a link leaving its folder: {name!r} -> {m.linkname!r}")
        return
    if not (m.isreg() or m.isdir()):
        raise BadArchive(f"the archive holds {name!r}, which is not a file, folder or link "
                         "(a device, fifo or hard link)")


def unpack(data: bytes, dest: str | os.PathLike[str]) -> int:
    """Unpack archive bytes (gzip'd or plain tar) into the existing empty folder `dest`,
    checking every entry first (check_member) and extracting with tarfile's `data` filter.
    Returns the number of entries. Raises BadArchive."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            members = tar.getmembers()
            for m in members:
                check_member(m)
            tar.extractall(dest, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile) as e:
        raise BadArchive(f"the archive cannot be unpacked: {e}") from e
    return len(members)

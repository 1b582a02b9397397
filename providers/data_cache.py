"""A node's cache of a job's `data` (issue 26): fsspec URIs (a file or a folder) fetched once per
version and linked read-only into each rank's folder.

An entry is keyed by the URI and what the store says identifies its content now: the object's
version id, ETag or checksum when the store gives one, else its size and modification time
(for a folder, those of every file under it). A changed object is a new key, fetched anew; an
unchanged one is linked from the cache without a download. Entries are written aside and
renamed into place, then made read-only (files 0444, folders 0555): a rank reads them through a
symbolic link at the path the job named. A URI that cannot be read fails the rank's start with
`start_failed:data_unavailable` (providers.start_errors). `stats.json` counts fetches and hits.

The node fetches with its own authority, so a job's URI is hostile until checked (`reachable`):
a local path (`file://`) is read only under the roots the node names in
ONEPOOL_DATA_FILE_ROOTS (os.pathsep-separated; none by default: a job must not copy the node's
own files, its credentials among them, into its folder), every file of a folder included
after links are resolved; an http(s) URI must not name a loopback, link-local (the cloud
metadata service and the node's credentials), unspecified or multicast address.

The cache holds at most `cap_bytes` (like the code cache, providers.code_cache): after a new
entry is added, the least recently used others go (a use touches the entry), except those a
live rank links to (`in_use()`: their keys; a rank reads its data through the link while it
runs). An entry in use stays even when that leaves the cache over its cap.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from providers import start_errors
from providers.base import StartFailed

log = logging.getLogger("onepool.data")
DATA_ENV = "ONEPOOL_DATA"  # the rank's `data`, JSON {path: uri}
DEFAULT_CAP = 100 * 1024**3
FILE_ROOTS_ENV = "ONEPOOL_DATA_FILE_ROOTS"  # where a job's file:// data may be read on this node
IDENTITY = ("VersionId", "version_id", "ETag", "etag", "md5Hash", "crc32c", "checksum", "generation")


def file_roots_from_env() -> list[Path]:
    """The node's roots for file:// data (FILE_ROOTS_ENV), resolved; none when unset."""
    return [Path(r).resolve() for r in os.environ.get(FILE_ROOTS_ENV, "").split(os.pathsep) if r]


def reachable(uri: str, roots: Sequence[Path]) -> None:
    """Raise ValueError, naming the rule, when this node must not fetch `uri` for a job (see
    the module's doc), before anything of it is read."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol in ("file", "local"):
        top = Path(path).resolve()
        found = [top] + ([Path(r, n).resolve() for r, _, files in os.walk(top) for n in files]
                         if top.is_dir() else [])
        outside = [p for p in found if not any(p == r or r in p.parents for r in roots)]
        if outside:
            raise ValueError(f"{uri}: a file:// URI is read on this node only under its "
                             f"{FILE_ROOTS_ENV} ({os.pathsep.join(map(str, roots)) or 'none named'}); "
                             f"{outside[0]} is not")
    elif protocol in ("http", "https"):
        host = urlsplit(uri).hostname or ""
        try:
            addrs = {ipaddress.ip_address(a[4][0].split("%")[0]) for a in socket.getaddrinfo(host, None)}
        except (OSError, ValueError) as e:
            raise ValueError(f"{uri}: its host cannot be resolved ({e})") from None
        bad = [a for a in addrs if a.is_loopback or a.is_link_local or a.is_unspecified or a.is_multicast]
        if bad:
            raise ValueError(f"{uri}: {host} is {bad[0]}, a loopback or link-local address this node "
                             "does not fetch for a job (the metadata service holds the node's credentials)")


def _identity(info: dict[str, Any]) -> list[Any]:
    for k in IDENTITY:
        if info.get(k):
            return [k, str(info[k])]
    return ["size+mtime", info.get("size"), str(info.get("mtime") or info.get("LastModified") or
                                                 info.get("updated") or info.get("created"))]


def content_key(uri: str) -> tuple[str, Any, str]:
    """(cache key, fsspec filesystem, path) of `uri` as it is now. Raises OSError."""
    import fsspec

    fs, path = fsspec.core.url_to_fs(uri)
    info = fs.info(path)
    if info.get("type") == "directory":
        parts = [[p, _identity(i)] for p, i in sorted(fs.find(path, detail=True).items())]
    else:
        parts = [_identity(info)]
    key = hashlib.sha256(json.dumps([uri, parts], default=str).encode()).hexdigest()
    return key, fs, path


def _read_only(p: Path) -> None:
    for root, dirs, files in os.walk(p):
        for f in files:
            os.chmod(os.path.join(root, f), 0o444)
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o555)
    os.chmod(p, 0o555 if p.is_dir() else 0o444)


def _bytes(p: Path) -> int:
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())


def _remove(p: Path) -> None:
    """Remove a read-only entry (its folders made writable first)."""
    for root, dirs, _ in os.walk(p):
        os.chmod(root, 0o755)
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
    shutil.rmtree(p, ignore_errors=True)


class DataCache:
    """The data cache under `root` (see the module's doc). Thread-safe in one process."""

    def __init__(self, root: str | os.PathLike[str], cap_bytes: int = DEFAULT_CAP,
                 in_use: Callable[[], set[str]] = set, file_roots: Sequence[Path] | None = None) -> None:
        self.root = Path(root)
        self.file_roots = list(file_roots) if file_roots is not None else file_roots_from_env()
        self.cap_bytes, self.in_use = cap_bytes, in_use
        self._lock = threading.Lock()

    def key_of(self, entry: Path) -> str:
        """The key of a path `get` returned (what `in_use` names)."""
        return entry.relative_to(self.root).parts[0]

    def _evict(self, keep: set[str]) -> None:
        """Drop the least recently used entries (never those in `keep` nor in use) while over the cap."""
        entries = [(p.stat().st_mtime, p) for p in self.root.iterdir()
                   if p.is_dir() and not p.name.startswith(".")]
        sizes = {p: _bytes(p) for _, p in entries}
        total = sum(sizes.values())
        if total <= self.cap_bytes:
            return
        busy = self.in_use() | keep
        for _, p in sorted(entries, key=lambda e: e[0]):
            if total <= self.cap_bytes:
                break
            if p.name in busy:
                continue
            _remove(p)
            total -= sizes[p]
            log.info("data: evicted %s from the cache (%d bytes)", p.name, sizes[p])

    @property
    def stats(self) -> dict[str, int]:
        try:
            return {k: int(v) for k, v in json.loads((self.root / "stats.json").read_text()).items()}
        except (OSError, ValueError):
            return {"fetches": 0, "hits": 0}

    def _count(self, **add: int) -> None:
        st = self.stats
        for k, v in add.items():
            st[k] = st.get(k, 0) + v
        (self.root / "stats.json.tmp").write_text(json.dumps(st))
        (self.root / "stats.json.tmp").replace(self.root / "stats.json")

    def get(self, uri: str, keep: frozenset[str] = frozenset()) -> Path:
        """The cached copy of `uri` as it is now (a file or folder, read-only); a fetch may evict
        others, never those whose keys are in `keep`. Raises StartFailed."""
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            try:
                reachable(uri, self.file_roots)
                key, fs, path = content_key(uri)
                entry = self.root / key / PurePosixPath(path.rstrip("/")).name
                if entry.exists():
                    now = time.time()
                    os.utime(self.root / key, (now, now))
                    self._count(hits=1)
                    return entry
                tmp = self.root / f".{key}.tmp"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir()
                target = tmp / entry.name
                fs.get(path, str(target), recursive=fs.isdir(path))
            except (OSError, ValueError, ImportError) as e:
                raise StartFailed(f"data {uri} cannot be fetched: {e}",
                                  cause=start_errors.cause("data_unavailable")) from e
            _read_only(target)
            tmp.replace(self.root / key)
            self._count(fetches=1)
            self._evict({key, *keep})
            return entry

    def link(self, mapping: dict[str, str], into: Path) -> list[str]:
        """Link every `path: uri` of a job's `data` under `into` (its working folder). Paths were
        checked at submit (relative, no `..`); an existing file there is replaced by the link.
        Returns the keys of the entries linked (in use while the rank lives)."""
        keys: list[str] = []
        for rel, uri in sorted(mapping.items()):
            src = self.get(uri, keep=frozenset(keys))
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink() or dest.is_file():
                dest.unlink()
            elif dest.is_dir():
                shutil.rmtree(dest)
            dest.symlink_to(src)
            keys.append(self.key_of(src))
        return keys

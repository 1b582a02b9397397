"""A node's cache of a job's `data` (issue 26): fsspec URIs (a file or a folder) fetched once per
version and linked read-only into each rank's folder.

An entry is keyed by the URI and what the store says identifies its content now: the object's
version id, ETag or checksum when the store gives one, else its size and modification time
(for a folder, those of every file under it). A changed object is a new key, fetched anew; an
unchanged one is linked from the cache without a download. Entries are written aside and
renamed into place, then made read-only (files 0444, folders 0555): a rank reads them through a
symbolic link at the path the job named. A URI that cannot be read fails the rank's start with
`start_failed:data_unavailable` (providers.start_errors). `stats.json` counts fetches and hits.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path, PurePosixPath
from typing import Any

from providers import start_errors
from providers.base import StartFailed

DATA_ENV = "ONEPOOL_DATA"  # the rank's `data`, JSON {path: uri}
IDENTITY = ("VersionId", "version_id", "ETag", "etag", "md5Hash", "crc32c", "checksum", "generation")


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


class DataCache:
    """The data cache under `root`. Thread-safe in one process."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

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

    def get(self, uri: str) -> Path:
        """The cached copy of `uri` as it is now (a file or folder, read-only). Raises StartFailed."""
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            try:
                key, fs, path = content_key(uri)
                entry = self.root / key / PurePosixPath(path.rstrip("/")).name
                if entry.exists():
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
            return entry

    def link(self, mapping: dict[str, str], into: Path) -> None:
        """Link every `path: uri` of a job's `data` under `into` (its working folder). Paths were
        checked at submit (relative, no `..`); an existing file there is replaced by the link."""
        for rel, uri in sorted(mapping.items()):
            src = self.get(uri)
            dest = into / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink() or dest.is_file():
                dest.unlink()
            elif dest.is_dir():
                shutil.rmtree(dest)
            dest.symlink_to(src)

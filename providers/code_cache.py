"""A node's cache of unpacked code snapshots (issue 26, part 1), keyed by sha256.

`CodeCache.checkout(digest, uri, dest)` gives a rank its private writable copy of the
snapshot in `dest`: from the cache when the digest is there (nothing fetched), else fetched
from `uri` (fsspec: s3://, gs://, file://, ...), verified against the digest, unpacked
(broker.codepack.unpack: the archive is hostile) and kept. A download whose sha256 does not
match is fetched once more; a second mismatch fails the start with the cause
`start_failed:code_unverified`. A snapshot that cannot be fetched: `code_unavailable`; one
that does not unpack safely: `code_bad_archive` (providers.start_errors).

The cache holds at most `cap_bytes` of unpacked files: after a new entry is added, the least
recently used others go (a use touches the entry's folder). Entries appear atomically (unpacked
aside, then renamed), so a crash leaves no half entry. `stats.json` counts fetches and hits
(what the node downloaded, and what it did not need to).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from broker.codepack import DIGEST, BadArchive, sha256_of, unpack
from providers import start_errors
from providers.base import StartFailed

log = logging.getLogger("onepool.code")
DEFAULT_CAP = 10 * 1024**3
MAX_ARCHIVE = 2 * 1024**3  # a download larger than this is refused (the submit limit is far below)
Fetch = Callable[[str], bytes]


def fsspec_fetch(uri: str) -> bytes:
    """The object at `uri`, read whole (at most MAX_ARCHIVE bytes). Raises OSError."""
    import fsspec

    with fsspec.open(uri, "rb") as f:
        data: bytes = f.read(MAX_ARCHIVE + 1)
    if len(data) > MAX_ARCHIVE:
        raise OSError(f"{uri} is larger than {MAX_ARCHIVE} bytes")
    return data


def _tree_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and not p.is_symlink())


class CodeCache:
    """The snapshot cache under `root` (see the module's doc). Thread-safe in one process."""

    def __init__(self, root: str | os.PathLike[str], cap_bytes: int = DEFAULT_CAP,
                 fetch: Fetch = fsspec_fetch) -> None:
        self.root = Path(root)
        self.cap_bytes, self.fetch = cap_bytes, fetch
        self._lock = threading.Lock()

    def _entry(self, digest: str) -> Path:
        return self.root / digest

    @property
    def stats(self) -> dict[str, int]:
        try:
            data = json.loads((self.root / "stats.json").read_text())
            return {k: int(v) for k, v in data.items()}
        except (OSError, ValueError):
            return {"fetches": 0, "hits": 0, "fetched_bytes": 0}

    def _count(self, **add: int) -> None:
        st = self.stats
        for k, v in add.items():
            st[k] = st.get(k, 0) + v
        tmp = self.root / "stats.json.tmp"
        tmp.write_text(json.dumps(st))
        tmp.replace(self.root / "stats.json")

    def holds(self) -> list[str]:
        """The digests cached here, most recently used first."""
        if not self.root.is_dir():
            return []
        entries = [p for p in self.root.iterdir() if p.is_dir() and DIGEST.match(p.name)]
        return [p.name for p in sorted(entries, key=lambda p: p.stat().st_mtime, reverse=True)]

    def get(self, digest: str, uri: str) -> Path:
        """The unpacked snapshot's folder (read it, do not write it). Raises StartFailed."""
        if not DIGEST.match(digest):
            raise StartFailed(f"code: {digest!r} is not a sha256",
                              cause=start_errors.cause("code_bad_archive"))
        with self._lock:
            self.root.mkdir(parents=True, exist_ok=True)
            entry = self._entry(digest)
            if entry.is_dir():
                now = time.time()
                os.utime(entry, (now, now))
                self._count(hits=1)
                return entry
            data = self._verified(digest, uri)
            tmp = self.root / f".{digest}.{os.getpid()}.{threading.get_ident()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            try:
                unpack(data, tmp)
            except BadArchive as e:
                shutil.rmtree(tmp, ignore_errors=True)
                raise StartFailed(f"code snapshot sha256:{digest} from {uri}: {e}",
                                  cause=start_errors.cause("code_bad_archive")) from e
            tmp.replace(entry)
            self._evict(keep=digest)
            return entry

    def _verified(self, digest: str, uri: str) -> bytes:
        got = ""
        for attempt in (1, 2):  # a damaged download is fetched once more
            try:
                data = self.fetch(uri)
            except (OSError, ValueError) as e:
                raise StartFailed(f"code snapshot sha256:{digest} cannot be fetched from {uri}: {e}",
                                  cause=start_errors.cause("code_unavailable")) from e
            self._count(fetches=1, fetched_bytes=len(data))
            got = sha256_of(data)
            if got == digest:
                return data
            log.warning("code: %s (try %d) has sha256 %s, not %s", uri, attempt, got, digest)
        raise StartFailed(f"code snapshot from {uri} does not match its sha256 twice (expected {digest}, "
                          f"got {got}): the stored copy is damaged; submit again to upload it anew",
                          cause=start_errors.cause("code_unverified"))

    def _evict(self, keep: str) -> None:
        """Drop the least recently used entries (never `keep`) while the cache is over its cap."""
        entries = [(p.stat().st_mtime, p) for p in self.root.iterdir()
                   if p.is_dir() and DIGEST.match(p.name)]
        sizes = {p: _tree_bytes(p) for _, p in entries}
        total = sum(sizes.values())
        for _, p in sorted(entries, key=lambda e: e[0]):
            if total <= self.cap_bytes:
                break
            if p.name == keep:
                continue
            shutil.rmtree(p, ignore_errors=True)
            total -= sizes[p]
            log.info("code: evicted sha256:%s from the cache (%d bytes)", p.name, sizes[p])

    def checkout(self, digest: str, uri: str, dest: Path) -> Path:
        """A private writable copy of the snapshot at `dest` (made; must not exist). Raises
        StartFailed."""
        src = self.get(digest, uri)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(dest)
        shutil.copytree(src, dest, symlinks=True)
        return dest

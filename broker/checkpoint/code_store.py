"""Code snapshots in object storage (issue 26): `<store root>/code/<sha256>.tar.gz`, written
once per digest, verified before it is written. The server writes them (PUT /v1/code/...,
or the embedded client directly); nodes read them (providers.code_cache)."""

from __future__ import annotations

import hashlib
import uuid

import fsspec

from broker.codepack import DIGEST

MAX_UPLOAD = 256 * 1024 * 1024  # bytes of one uploaded archive (packing limits files to 200 MiB)


class DigestMismatch(ValueError):
    """The bytes do not hash to the digest they were sent as: send them again, whole."""


def code_uri(root: str, team: str, sha256: str) -> str:
    """Where `team`'s snapshot with this digest lives in the store at `root` (per team: a team
    runs only code it uploaded)."""
    if not DIGEST.match(sha256):
        raise ValueError(f"sha256: must be 64 lowercase hex digits (got {sha256[:80]!r})")
    return f"{root.rstrip('/')}/code/{team}/{sha256}.tar.gz"


def has(root: str, team: str, sha256: str) -> bool:
    """Whether the store holds that snapshot."""
    fs, path = fsspec.core.url_to_fs(code_uri(root, team, sha256))
    return bool(fs.exists(path))


def put(root: str, team: str, sha256: str, data: bytes) -> bool:
    """Store `data` as the snapshot `sha256` unless it is there; True if written now. Raises
    DigestMismatch (nothing written), OSError (the store)."""
    got = hashlib.sha256(data).hexdigest()
    if got != sha256:
        raise DigestMismatch(f"the body's sha256 is {got}, not {sha256}: the upload was damaged "
                             "or cut off; send it again")
    if has(root, team, sha256):
        return False
    fs, path = fsspec.core.url_to_fs(code_uri(root, team, sha256))
    parent = path.rsplit("/", 1)[0]
    fs.makedirs(parent, exist_ok=True)
    tmp = f"{parent}/.{sha256}.{uuid.uuid4().hex}.tmp"  # seen under its name only once whole
    fs.pipe_file(tmp, data)
    fs.mv(tmp, path)
    return True

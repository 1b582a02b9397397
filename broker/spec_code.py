"""The job spec's `code` field (issue 26): what code a job's ranks run in.

    code: none                                   nothing shipped: the job runs in `workdir` (a
                                                 shared filesystem) or in its rank's own folder
    code: .            (or any folder path)      the client packs that folder (broker.codepack),
                                                 uploads it once per digest, and sends sha256:...
    code: sha256:<64 hex>                        a snapshot already uploaded (PUT /v1/code/...)
    code: s3://bucket/train.tar.gz#sha256=<hex>  a prepared archive (tar or tar.gz) any node
                                                 fetches and verifies against that digest

Not given (the default): as `none`, today's behaviour (a job over HTTP without `workdir`
runs in its rank folder; an embedded one in the submit folder). A folder is only packed when
asked (`--code .`): packing by default would ship whatever the current folder happens to hold.
`code` and `workdir` exclude each other.

`setup` (a command, or a list of them, each run with `bash -c`) runs on a node before the job's
command, once per node per (image, code, setup) digest (providers.setup_runner): at most
MAX_SETUP commands of at most MAX_SETUP_BYTES in all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

NONE = "none"
HELP = ("none, a folder to pack (e.g. `.`), sha256:<64 hex digits> (a snapshot uploaded already), "
        "or the URI of a prepared archive with its digest (s3://bucket/code.tar.gz#sha256=<64 hex digits>)")
_SHA = re.compile(r"^sha256:([0-9a-f]{64})$")
_URI = re.compile(r"^([a-z][a-z0-9+.-]*)://(.+)#sha256=([0-9a-f]{64})$")
URI_SCHEMES = ("file", "s3", "gs", "gcs", "az", "abfs", "http", "https")


MAX_SETUP = 32
MAX_SETUP_BYTES = 64 * 1024


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


def check_code(v: str | None) -> str | None:
    """The JobSpec validator: `v` unchanged, or ValueError."""
    if v is not None:
        parse_code(v)
    return v


def check_setup(v: list[str]) -> list[str]:
    """The JobSpec validator of `setup` (a string was made a one-item list before). Raises
    ValueError naming the limit."""
    if len(v) > MAX_SETUP:
        raise ValueError(f"at most {MAX_SETUP} commands (got {len(v)}): join them with && or put them "
                         "in a script of the code")
    total = sum(len(c.encode()) for c in v)
    if total > MAX_SETUP_BYTES:
        raise ValueError(f"at most {MAX_SETUP_BYTES} bytes of commands in all (got {total})")
    bad = [c for c in v if not c.strip() or "\x00" in c]
    if bad:
        raise ValueError(f"each command must be non-empty text without NUL bytes (got {bad[0]!r})")
    return v

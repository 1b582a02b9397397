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

`data` maps paths in the rank's working folder (relative, no `..`) to fsspec URIs (a file or a
folder: s3://, gs://, file://, ...): fetched into the node's cache once per version, linked
read-only (providers.data_cache). Not with `workdir` (a shared folder is no place for a node's
links).

`setup` (a command, or a list of them, each run with `bash -c`) runs on a node before the job's
command, once per node per (image, code, setup) digest (providers.setup_runner): at most
MAX_SETUP commands of at most MAX_SETUP_BYTES in all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from broker.codepack import (  # noqa: F401  (the thin client's; re-exported for the spec)
    HELP,
    NONE,
    URI_SCHEMES,
    CodeRef,
    parse_code,
    relative_to_file,
)
from broker.spec_types import MAX_PATH, _Strict

MAX_DATA = 64
MAX_SETUP = 32
MAX_SETUP_BYTES = 64 * 1024


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


def check_data(v: dict[str, str]) -> dict[str, str]:
    """The JobSpec validator of `data`. Raises ValueError naming the entry and the rule."""
    if len(v) > MAX_DATA:
        raise ValueError(f"at most {MAX_DATA} entries (got {len(v)})")
    for path, uri in v.items():
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
            raise ValueError(f"{path!r}: a path must be relative to the rank's folder, without `.`, `..` "
                             "or empty parts (e.g. data/train)")
        scheme = uri.split("://", 1)[0] if "://" in uri else ""
        if scheme not in URI_SCHEMES:
            raise ValueError(f"{path!r}: the URI must start with one of "
                             f"{', '.join(s + '://' for s in URI_SCHEMES)} (got {uri[:80]!r})")
    return v


class Shipping(_Strict):
    """The job spec's `code`, `setup` and `data` (see the module's doc). The validators read
    `workdir`, which the job spec defines."""

    if TYPE_CHECKING:  # a field of the job spec
        workdir: str | None

    code: str | None = Field(default=None, max_length=MAX_PATH)
    setup: list[str] = Field(default_factory=list)
    data: dict[str, str] = Field(default_factory=dict)

    @field_validator("code")
    @classmethod
    def _code(cls, v: str | None) -> str | None:
        return check_code(v)

    @field_validator("data")
    @classmethod
    def _data(cls, v: dict[str, str]) -> dict[str, str]:
        return check_data(v)

    @field_validator("setup", mode="before")
    @classmethod
    def _setup(cls, v: Any) -> Any:
        return check_setup([v] if isinstance(v, str) else v) if isinstance(v, str | list) else v

    @model_validator(mode="after")
    def _code_or_workdir(self) -> Shipping:
        if self.code not in (None, NONE) and self.workdir is not None:
            raise ValueError("code and workdir: give one (code ships the job's files to any node; "
                             "workdir names a folder every node already shares)")
        if self.data and self.workdir is not None:
            raise ValueError("data and workdir: give one (data is linked into the rank's own folder)")
        return self


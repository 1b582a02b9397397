"""A checkpoint's manifest: what a committed step holds, parsed as untrusted data.

A manifest is written by a job (through broker.runtime, or by hand), so parsing it checks
every file name, size and digest with broker.checkpoint.names. A manifest that is not one
(garbled JSON, unknown format) raises: its step counts as not committed. A manifest whose
file list breaks the rules parses with no files and `problems` naming the bad entry: its
step is committed but damaged, and readers fall back to the previous one.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any

from broker.checkpoint.names import BadName, check_files
from broker.errors import CheckpointError

FORMAT_VERSION = 1


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    step: int
    time: float
    job_id: int | None
    attempt: int | None
    written_by: dict[str, str]
    files: dict[str, FileEntry]
    format: int = FORMAT_VERSION
    world_size: int = 1
    writer: str = ""
    copied_from: str | None = None
    save_s: float | None = None  # seconds from the writer's save() to its commit (None: unknown)
    uri: str = field(default="", compare=False)  # the step folder (not stored)
    problems: tuple[str, ...] = field(default=(), compare=False)  # why it is damaged (not stored)

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files.values())

    def to_json(self) -> str:
        d = asdict(self)
        d.pop("uri")
        d.pop("problems")
        return json.dumps(d, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, uri: str) -> Manifest:
        """Parse a manifest. Raises CheckpointError/ValueError if it is not one (garbled: the
        step counts as not committed); a manifest whose file list breaks the rules of
        broker.checkpoint.names is returned with no files and `problems` naming the entry."""
        d = json.loads(text, object_pairs_hook=Pairs)
        if not isinstance(d, dict) or d.get("format") != FORMAT_VERSION:
            raise CheckpointError(f"{uri}: unknown manifest format {d.get('format')!r}"
                                  if isinstance(d, dict) else f"{uri}: not a manifest")
        files: dict[str, FileEntry] = {}
        problems: tuple[str, ...] = ()
        try:
            files = entries_of(d["files"])
            _check_meta(d)
        except BadName as e:
            files, problems = {}, (str(e),)
            d = {k: v for k, v in d.items() if k in ("step", "time")} | {"time": 0.0}
        return cls(step=int(d["step"]), time=float(d["time"]), job_id=d.get("job_id"),
                   attempt=d.get("attempt"), written_by=dict(d.get("written_by", {})),
                   files=files, world_size=int(d.get("world_size", 1)),
                   writer=str(d.get("writer", "")), copied_from=d.get("copied_from"),
                   save_s=_duration(d.get("save_s")), uri=uri, problems=problems)


MAX_META_CHARS = 1024
"""The longest string a manifest's other fields (writer, copied_from, written_by) may hold."""


def _duration(v: Any) -> float | None:
    """A manifest's save_s as the job wrote it: a finite number >= 0, else unknown (None): a
    measurement, not part of the checkpoint, so garbage there damages nothing."""
    if type(v) in (int, float) and math.isfinite(v) and v >= 0:
        return float(v)
    return None


def _check_meta(d: dict[str, Any]) -> None:
    """The manifest's fields besides its files, written by a job too. Raises BadName."""
    def short(v: Any) -> bool:
        return isinstance(v, str) and len(v) <= MAX_META_CHARS

    checks = [
        ("job_id", d.get("job_id") is None or type(d.get("job_id")) is int, "an integer or null"),
        ("attempt", d.get("attempt") is None or type(d.get("attempt")) is int, "an integer or null"),
        ("world_size", type(d.get("world_size", 1)) is int and 1 <= d.get("world_size", 1) <= 100_000,
         "an integer from 1 to 100000"),
        ("time", type(d.get("time")) in (int, float) and math.isfinite(d["time"]), "a finite number"),
        ("writer", short(d.get("writer", "")), f"a string of at most {MAX_META_CHARS} characters"),
        ("copied_from", d.get("copied_from") is None or short(d.get("copied_from")),
         f"null or a string of at most {MAX_META_CHARS} characters"),
        ("written_by", isinstance(d.get("written_by", {}), dict) and len(d.get("written_by", {})) <= 16
         and all(short(k) and short(v) for k, v in d.get("written_by", {}).items()),
         "an object of at most 16 short strings"),
    ]
    for key, ok, allowed in checks:
        if not ok:
            raise BadName(f"manifest field {key!r} is {str(d.get(key))[:80]!r}: it must be {allowed}")


class Pairs(dict[str, Any]):
    """A JSON object that remembers its pairs as written (json keeps only a repeated key's last)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def entries_of(d: Any) -> dict[str, FileEntry]:
    """A file list (name -> {size, sha256}) checked by broker.checkpoint.names. Raises BadName."""
    if not isinstance(d, dict):
        raise BadName("the file list must be an object of name -> {size, sha256}")
    pairs = d.pairs if isinstance(d, Pairs) else list(d.items())
    return {k: FileEntry(*v) for k, v in check_files(pairs).items()}


def damaged(step: int, uri: str, why: str) -> Manifest:
    """A committed step whose manifest cannot be trusted: no files, and why."""
    return Manifest(step=step, time=0.0, job_id=None, attempt=None, written_by={}, files={},
                    uri=uri, problems=(f"{why}: refused",))

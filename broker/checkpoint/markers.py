"""Multi-node shards and the attempts' markers of a job's checkpoint store (CheckpointStore
inherits them; the layout is in broker.checkpoint.checkpoints' docstring): each rank's shard
and its marker, gathered by rank 0 before it commits; an attempt's progress marker (its first
new step, which ends its restart) and its ranks' done markers, all read with a size limit.
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from broker.checkpoint.manifest import FileEntry, Pairs, entries_of
from broker.checkpoint.names import MAX_MANIFEST_BYTES, BadName
from broker.errors import CheckpointError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from broker.checkpoint.checkpoints import Source

ATTEMPTS_DIR = "_attempts"
MAX_MARKER_BYTES = 64 << 10
"""The largest progress or done marker the broker reads (they hold a few numbers)."""


class TooLarge(CheckpointError):
    """A file a job wrote for the broker to read is larger than its limit: it is refused."""


def shard_dir(rank: int) -> str:
    return f"rank-{rank:05d}"



class ShardsAndMarkers:
    """The shards and markers of broker.checkpoint.checkpoints.CheckpointStore (see the module
    docstring)."""

    fs: AbstractFileSystem

    if TYPE_CHECKING:  # provided by CheckpointStore
        def _path(self, *parts: str) -> str: ...
        def step_path(self, step: int, *parts: str) -> str: ...
        def _exists(self, path: str) -> bool: ...
        def _refuse_committed(self, step: int) -> None: ...
        def _write_durable(self, path: str, data: bytes) -> None: ...
        def _read_small(self, path: str, limit: int) -> bytes: ...
        def put_files(self, step: int, files: Mapping[str, Source],
                      under: str = "") -> dict[str, FileEntry]: ...

    # -- multi-node shards ------------------------------------------------------------------
    def write_shard(self, step: int, rank: int, files: Mapping[str, Source]) -> dict[str, FileEntry]:
        """Rank `rank` uploads its shard under `rank-{r}/`, then its marker (last)."""
        if not files:
            raise CheckpointError("a shard needs at least one file")
        self._refuse_committed(step)
        entries = self.put_files(step, files, under=shard_dir(rank))
        marker = {k: asdict(v) for k, v in entries.items()}
        self._write_durable(self.step_path(step, f"{shard_dir(rank)}.json"),
                            json.dumps(marker, sort_keys=True).encode())
        return entries

    def missing_shards(self, step: int, world_size: int) -> list[int]:
        """Ranks whose shard marker for `step` is not present yet."""
        return [r for r in range(world_size)
                if not self._exists(self.step_path(step, f"{shard_dir(r)}.json"))]

    def gather_shards(self, step: int, world_size: int) -> dict[str, FileEntry]:
        """Every rank's file entries from their markers. Raises CheckpointError if one is missing."""
        out: dict[str, FileEntry] = {}
        for r in range(world_size):
            try:
                text = self._read_small(self.step_path(step, f"{shard_dir(r)}.json"), MAX_MANIFEST_BYTES)
                got = entries_of(json.loads(text, object_pairs_hook=Pairs))
            except (FileNotFoundError, ValueError, KeyError, TypeError, TooLarge):
                raise CheckpointError(f"step {step}: rank {r} has no complete shard; "
                                      "not committing") from None
            outside = [n for n in got if not n.startswith(f"{shard_dir(r)}/")]
            if outside:
                raise BadName(f"step {step}: rank {r}'s marker lists {outside[0]!r}, outside "
                              f"its shard folder {shard_dir(r)}/; not committing")
            out.update(got)
        return out

    # -- attempts' first step ---------------------------------------------------------------
    def mark_progress(self, attempt: int, step: int, now: float, *, total: int | None = None,
                      first_step: int | None = None, first_time: float | None = None) -> None:
        """Record that attempt `attempt` completed `step` at `now` (of `total` steps, when known;
        its first reported step and time, for a rate). Rewritten as it progresses; the first
        write also tells the broker its restart is over."""
        path = self._path(ATTEMPTS_DIR, f"attempt-{attempt:05d}.json")
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, json.dumps({
            "step": step, "time": now, "total": total,
            "first_step": step if first_step is None else first_step,
            "first_time": now if first_time is None else first_time}).encode())

    def mark_done(self, attempt: int, rank: int, now: float) -> None:
        """Record that rank `rank` of attempt `attempt` finished its work (runtime.done())."""
        path = self._path(ATTEMPTS_DIR, f"attempt-{attempt:05d}-done-rank-{rank:05d}.json")
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, json.dumps({"time": now}).encode())

    def all_done(self, attempt: int, world_size: int) -> bool:
        """Whether every rank of `attempt` recorded mark_done (read object by object: no
        cached listing)."""
        for rank in range(world_size):
            try:
                self._read_small(self._path(ATTEMPTS_DIR, f"attempt-{attempt:05d}-done-rank-{rank:05d}.json"),
                                 MAX_MARKER_BYTES)
            except (TooLarge, BadName):
                continue  # present (a FIFO, say: never read): its content does not matter
            except FileNotFoundError:
                return False
        return True

    def progress(self, attempt: int) -> dict[str, Any] | None:
        """What mark_progress wrote for `attempt`, or None."""
        try:
            got = json.loads(self._read_small(self._path(ATTEMPTS_DIR, f"attempt-{attempt:05d}.json"),
                                              MAX_MARKER_BYTES))
            return got if isinstance(got, dict) else None
        except (FileNotFoundError, ValueError, TooLarge, BadName):
            return None

"""A rank's output, capped: the tail is kept, the rest is counted.

A job's output is untrusted data: however much a rank prints, at most `cap` bytes of it stay
on disk (the broker's home holds the database too). The output is one stream of bytes with
logical offsets from 0; on disk it is at most two segment files in the rank's folder:
`output.log` (the stream from offset 0, also what a rank that printed little has, and what
Slurm writes) and `output.log.<START>` (the stream from offset START). A segment holds at
most cap // 2 bytes; when the newest is full a new one starts and every older one but the
newest is deleted, so at most `cap` bytes are kept and at least cap // 2 of the tail (once
that much was printed).

Bytes no longer on disk are *dropped*: everything before the oldest kept segment, and any
gap between segments (output a node dropped before it shipped it: see `write_at`). Readers
ask from an offset and get the bytes from there, or from the next byte still kept (and learn
where that is), so `onepool logs` can say how much was dropped.

One writer per folder at a time (the rank's supervisor, or the server for what an agent
ships); readers may run at any time (a segment deleted under a reader is looked up again).
Standard library only: the rank's supervisor imports this.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from io import RawIOBase
from pathlib import Path

SEGMENT = "output.log"
DEFAULT_CAP = 64 * 1024 * 1024  # bytes per attempt (broker.output_cap_bytes)
MIN_CAP = 4096
CAP_ENV = "ONEPOOL_OUTPUT_CAP_BYTES"  # the per-rank cap the broker gives each rank's supervisor


@dataclass(frozen=True)
class Segment:
    path: Path
    start: int  # logical offset of its first byte
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


def per_rank_cap(attempt_cap: int, ranks: int) -> int:
    """Each rank's share of an attempt's cap (never below MIN_CAP)."""
    return max(MIN_CAP, attempt_cap // max(1, ranks))


def segments(run_dir: Path) -> list[Segment]:
    """The kept segments of the output in `run_dir`, oldest first."""
    out = []
    try:
        names = os.listdir(run_dir)
    except FileNotFoundError:
        return []
    for name in names:
        if name == SEGMENT:
            start = 0
        elif name.startswith(SEGMENT + ".") and name[len(SEGMENT) + 1:].isdigit():
            start = int(name[len(SEGMENT) + 1:])
        else:
            continue
        try:
            size = os.stat(run_dir / name).st_size
        except FileNotFoundError:  # deleted by the writer since the listing
            continue
        out.append(Segment(run_dir / name, start, size))
    return sorted(out, key=lambda s: s.start)


@dataclass(frozen=True)
class Extent:
    """How much was written (`end`: the next offset) and how much of it was dropped."""

    end: int
    dropped: int


def extent(run_dir: Path) -> Extent:
    segs = segments(run_dir)
    end = segs[-1].end if segs else 0
    return Extent(end=end, dropped=end - sum(s.size for s in segs))


def read(run_dir: Path, offset: int, limit: int) -> tuple[int, bytes]:
    """At most `limit` bytes of the output from logical `offset`, and the offset they start
    at: `offset`, or the first byte still kept after it when the bytes there were dropped.
    (offset, b"") when there is nothing at or after `offset` yet."""
    for _ in range(5):  # the writer may delete a segment between the listing and the open
        for seg in segments(run_dir):
            if offset >= seg.end:
                continue
            start = max(offset, seg.start)
            try:
                with open(seg.path, "rb") as f:
                    f.seek(start - seg.start)
                    return start, f.read(limit)
            except FileNotFoundError:
                break
        else:
            return offset, b""
    return offset, b""


class CappedOutput:
    """Appends to the output in `run_dir`, keeping at most `cap` bytes (see the module).
    Thread-safe (the supervisor's copy thread and its own messages share one)."""

    def __init__(self, run_dir: Path, cap: int) -> None:
        self.dir = run_dir
        self.segment_max = max(1, cap // 2)
        segs = segments(run_dir)
        self._cur = segs[-1] if segs else Segment(run_dir / SEGMENT, 0, 0)
        self._f: RawIOBase | None = None
        self._lock = threading.Lock()

    @property
    def end(self) -> int:
        """The offset after the last byte written."""
        return self._cur.end

    def append(self, data: bytes) -> int:
        """Append `data`; returns the new end."""
        return self.write_at(self.end, data)

    def write_at(self, offset: int, data: bytes) -> int:
        """Write `data`, which starts at logical `offset` of the stream: bytes before the end
        are skipped (a resend of what is here), bytes past the end leave a gap, counted as
        dropped (the sender dropped them). Returns the new end. Raises OSError when the disk
        refuses the bytes (what did land is accounted for)."""
        with self._lock:
            return self._write_at(offset, data)

    def _write_at(self, offset: int, data: bytes) -> int:
        if offset + len(data) <= self.end:
            return self.end
        if offset < self.end:
            data, offset = data[self.end - offset:], self.end
        if offset > self.end:
            self._start_segment(offset)
        view = memoryview(data)
        while view:
            room = self.segment_max - self._cur.size
            if room <= 0:
                self._start_segment(self._cur.end)
                continue
            f = self._file()
            try:
                written = f.write(view[:room]) or 0  # unbuffered: may write less
            finally:  # the file's size, whatever landed
                self._cur = Segment(self._cur.path, self._cur.start, os.fstat(f.fileno()).st_size)
            view = view[written:]
        return self.end

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def _file(self) -> RawIOBase:
        if self._f is None:  # unbuffered: what write() returns is on the file
            self._f = open(self._cur.path, "ab", buffering=0)  # noqa: SIM115  (kept open between writes)
        return self._f

    def _start_segment(self, start: int) -> None:
        """Start a segment at `start`; delete every segment but the current one and it."""
        self.close()
        keep = {self._cur.path.name} if self._cur.size else set()
        new = Segment(self.dir / f"{SEGMENT}.{start}", start, 0)
        new.path.touch()
        keep.add(new.path.name)
        for seg in segments(self.dir):
            if seg.path.name not in keep:
                seg.path.unlink(missing_ok=True)
        self._cur = new

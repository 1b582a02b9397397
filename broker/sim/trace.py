"""Read a job trace CSV: job_id, submit_time_s, duration_s, num_gpus, gpu_type, user, queue,
status (the format of shared/data/traces). Malformed rows fail with file, line and field."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from broker.errors import SpecError

COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus", "gpu_type", "user", "queue",
           "status")


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_s: float
    duration_s: float
    gpus: int
    gpu_type: str
    user: str
    queue: str


def read_trace(path: str | Path, limit: int | None = None) -> list[TraceJob]:
    """All rows (or the first `limit`), sorted by submit time.

    Raises SpecError naming the file, the line and the field of the first bad row
    (missing column, non-number, negative time, zero GPUs, ...).
    """
    p = Path(path)
    try:
        f = p.open(newline="")
    except OSError as e:
        raise SpecError(str(p), [f"cannot read the trace: {e.strerror}"]) from None
    out: list[TraceJob] = []
    with f:
        reader = csv.DictReader(f)
        missing = [c for c in (*COLUMNS[:4], "queue") if c not in (reader.fieldnames or [])]
        if missing:
            raise SpecError(str(p), [f"line 1: missing column(s) {', '.join(missing)}; "
                                     f"expected {', '.join(COLUMNS)}"])
        for row in reader:
            line = reader.line_num
            out.append(_row(p, line, row))
            if limit is not None and len(out) >= limit:
                break
    out.sort(key=lambda j: j.submit_s)
    return out


def _row(p: Path, line: int, row: dict[str, str]) -> TraceJob:
    def bad(field: str, why: str) -> SpecError:
        return SpecError(str(p), [f"line {line}, field {field}: {why} (got {row.get(field)!r})"])

    def num(field: str, cast: type, minimum: float) -> float:
        raw = row.get(field)
        try:
            v: float = cast(raw)
        except (TypeError, ValueError):
            raise bad(field, f"must be a {'whole ' if cast is int else ''}number") from None
        if v < minimum:
            raise bad(field, f"must be >= {minimum:g}")
        return v

    job_id = (row.get("job_id") or "").strip()
    if not job_id:
        raise bad("job_id", "must not be empty")
    return TraceJob(job_id=job_id, submit_s=num("submit_time_s", float, 0),
                    duration_s=num("duration_s", float, 1), gpus=int(num("num_gpus", int, 1)),
                    gpu_type=(row.get("gpu_type") or "").strip(),
                    user=(row.get("user") or "").strip(), queue=(row.get("queue") or "").strip())

"""Read and write a job trace CSV: job_id, submit_time_s, duration_s, num_gpus, gpu_type, user,
queue, status (the format of shared/data/traces). Malformed rows fail with file, line and field.

A trace exported from a broker's own history (`onepool replay --export`,
broker.state.history) adds optional columns for what a public trace lacks and a scenario
otherwise assigns by hash: `team`, `priority` (urgent|high|normal|low), `gpu_types` (the
acceptable types, `;`-separated; empty: any), `spot` (never|allowed|preferred),
`gpus_per_node` and `saves_on_signal` (1|0). An empty cell means "let the scenario assign it".
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from broker.errors import SpecError

COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_gpus", "gpu_type", "user", "queue",
           "status")
OPTIONAL = ("team", "priority", "gpu_types", "spot", "gpus_per_node", "saves_on_signal")
PRIORITIES = ("urgent", "high", "normal", "low")
SPOT_POLICIES = ("never", "allowed", "preferred")


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    submit_s: float
    duration_s: float
    gpus: int
    gpu_type: str
    user: str
    queue: str
    # known facts of a recorded job (empty/None: the scenario assigns them by hash)
    team: str = ""
    priority: str = ""
    gpu_types: tuple[str, ...] | None = None  # () = any type
    spot: str = ""
    gpus_per_node: int = 0  # 0: one node up to 8 GPUs, else whole nodes of 8
    saves_on_signal: bool | None = None


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

    def choice(field: str, allowed: tuple[str, ...]) -> str:
        v = (row.get(field) or "").strip()
        if v and v not in allowed:
            raise bad(field, f"must be one of {', '.join(allowed)} or empty")
        return v

    job_id = (row.get("job_id") or "").strip()
    if not job_id:
        raise bad("job_id", "must not be empty")
    gpus = int(num("num_gpus", int, 1))
    types = row.get("gpu_types")
    gpn = int(num("gpus_per_node", int, 1)) if (row.get("gpus_per_node") or "").strip() else 0
    if gpn and gpus % gpn:
        raise bad("gpus_per_node", f"must divide num_gpus ({gpus})")
    saves = (row.get("saves_on_signal") or "").strip()
    if saves not in ("", "0", "1"):
        raise bad("saves_on_signal", "must be 1, 0 or empty")
    return TraceJob(job_id=job_id, submit_s=num("submit_time_s", float, 0),
                    duration_s=num("duration_s", float, 1), gpus=gpus,
                    gpu_type=(row.get("gpu_type") or "").strip(),
                    user=(row.get("user") or "").strip(), queue=(row.get("queue") or "").strip(),
                    team=(row.get("team") or "").strip(), priority=choice("priority", PRIORITIES),
                    gpu_types=None if types is None else tuple(t.strip() for t in types.split(";")
                                                               if t.strip()),
                    spot=choice("spot", SPOT_POLICIES), gpus_per_node=gpn,
                    saves_on_signal=None if not saves else saves == "1")


def write_trace(path: str | Path, jobs: list[TraceJob]) -> None:
    """Write `jobs` as a trace CSV with the optional columns (read_trace reads it back equal)."""
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow((*COLUMNS, *OPTIONAL))
        for j in jobs:
            w.writerow((j.job_id, repr(j.submit_s), repr(j.duration_s), j.gpus, j.gpu_type, j.user,
                        j.queue, "", j.team, j.priority,
                        "" if j.gpu_types is None else ";".join(j.gpu_types), j.spot,
                        j.gpus_per_node or "",
                        "" if j.saves_on_signal is None else int(j.saves_on_signal)))

"""Job arrays and sweeps (issue 29), as pure rules: what one submit expands into, and how many
elements of an array may run at once.

- `parse_array("0-99%10")`: the indices (Slurm's forms: `A-B`, `A-B:STEP`, `I,J,K`, mixed with
  commas) and the throttle after `%`.
- `sweep_grid({"lr": [1e-3, 3e-4], "seed": [0, 1]})`: the grid's points, in the order the keys
  are given, the last key varying fastest (as nested loops would).
- `fill(text, point)`: `{lr}`-style fields of the command and environment filled from a point.
- `throttle(...)`: which pending elements of throttled arrays stay out of this cycle's plan, and
  why.

Every parse raises ValueError whose message says what is allowed; the spec layer names the field.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import product

MAX_ELEMENTS = 10_000  # one submit makes at most this many jobs
Scalar = str | int | float | bool
_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")
ARRAY_HELP = "indices like 0-99, 0-99:2 or 1,3,7 (mixed with commas), optionally %N to run at most N at once"


@dataclass(frozen=True, slots=True)
class ArrayRange:
    """The indices of an array, ascending and distinct, and at most how many run at once
    (None: no limit)."""

    indices: tuple[int, ...]
    max_running: int | None = None


def parse_array(text: str) -> ArrayRange:
    """`0-99%10` -> indices 0..99, at most 10 running. Raises ValueError saying what is allowed."""
    body, pct, limit = text.strip().partition("%")
    max_running: int | None = None
    if pct:
        if not limit.isdigit() or int(limit) < 1:
            raise ValueError(f"the limit after % must be a whole number >= 1 (got {text!r}); "
                             f"allowed: {ARRAY_HELP}")
        max_running = int(limit)
    found: set[int] = set()
    for part in body.split(","):
        m = _PART.match(part.strip())
        if m is None:
            raise ValueError(f"must be {ARRAY_HELP} (got {text!r})")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        step = int(m.group(3)) if m.group(3) is not None else 1
        if hi < lo or step < 1:
            raise ValueError(f"range {part.strip()!r} must go up (A-B with A <= B, step >= 1)")
        if (hi - lo) // step + 1 + len(found) > MAX_ELEMENTS:
            raise ValueError(f"at most {MAX_ELEMENTS} elements per array (got {text!r})")
        found.update(range(lo, hi + 1, step))
    return ArrayRange(tuple(sorted(found)), max_running)


def sweep_grid(grid: Mapping[str, Sequence[Scalar]]) -> list[dict[str, Scalar]]:
    """Every point of the grid, the first key varying slowest. Raises ValueError for a key that
    is not a name, an empty value list, or more than MAX_ELEMENTS points."""
    if not grid:
        raise ValueError("must name at least one field with its values, e.g. {lr: [0.001, 0.0003]}")
    size = 1
    for key, values in grid.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{key!r} is not a field name (letters, digits, '_'; used as {{name}})")
        if not values:
            raise ValueError(f"{key}: needs at least one value")
        size *= len(values)
    if size > MAX_ELEMENTS:
        raise ValueError(f"{size} points; at most {MAX_ELEMENTS} elements per sweep")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in product(*(grid[k] for k in keys))]


def show(value: Scalar) -> str:
    """A sweep value as it is written into a command or environment: `1e-3` stays `0.001`,
    booleans are lower-case (as YAML writes them)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def fill(text: str, point: Mapping[str, Scalar]) -> str:
    """`text` with each `{name}` of a field of `point` replaced by its value. Braces around
    other names (`${HOME}`, `{other}`) are left as they are."""
    return _FIELD.sub(lambda m: show(point[m.group(1)]) if m.group(1) in point else m.group(0), text)


def fields_used(texts: Iterable[str]) -> set[str]:
    """The `{name}` fields that appear in `texts`."""
    return {m.group(1) for t in texts for m in _FIELD.finditer(t)}


@dataclass(frozen=True, slots=True)
class Member:
    """A pending job's place in its array: the array's id, its index, and the array's limit of
    elements running at once (None: no limit)."""

    array_id: int
    index: int
    max_running: int | None


def throttle(pending: Sequence[int], members: Mapping[int, Member],
             running: Mapping[int, int]) -> dict[int, str]:
    """The pending jobs (by id) an array's limit keeps out of this cycle, each with why.

    `pending`: the ids of the jobs waiting; `members`: the array place of those that are array
    elements; `running`: per array id, its elements that hold or are taking GPUs now (attempts
    not ended). An array with limit N and R elements running lets its N - R lowest-indexed
    pending elements through; the rest wait. Jobs not in `members`, and arrays without a
    limit, are never held.
    """
    by_array: dict[int, list[tuple[int, int]]] = defaultdict(list)
    limits: dict[int, int] = {}
    for jid in pending:
        m = members.get(jid)
        if m is None or m.max_running is None:
            continue
        by_array[m.array_id].append((m.index, jid))
        limits[m.array_id] = m.max_running
    held: dict[int, str] = {}
    for aid, elements in by_array.items():
        limit, now_running = limits[aid], running.get(aid, 0)
        room = max(0, limit - now_running)
        for _, jid in sorted(elements)[room:]:
            held[jid] = (f"array {aid}: {now_running} of at most {limit} elements running "
                         f"(%{limit}); waits for one to end")
    return held

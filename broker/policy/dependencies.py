"""Dependencies between jobs (issue 29), as pure rules: the `after:` forms a submit gives, and
whether a job's dependencies are met, still pending, or can never be met.

No cycle can form: a submit may name only jobs that exist already (a job never waits for one
submitted after it), so a submit naming a job that does not exist yet is refused.

Forms (`after:` in a job spec, `--after` on the command line), like Slurm's --dependency:

- `12` or `12:ok`: after job 12 succeeded; `12:any`: after it ended, however; `12:failed`:
  after it failed (FAILED or BUDGET_EXHAUSTED).
- `7[*]:ok`: after every element of array 7 (an array is named by its first element's id).
- `7[i]:ok`: each element of this array after the element of array 7 with the same index
  (this submit must be an array or a sweep).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Condition = Literal["ok", "any", "failed"]
Scope = Literal["job", "all", "same"]
CONDITIONS: tuple[Condition, ...] = ("ok", "any", "failed")
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "BUDGET_EXHAUSTED")
AFTER_HELP = "JOB, JOB:ok, JOB:any, JOB:failed, ARRAY[*]:COND (every element) or ARRAY[i]:COND (same index)"
_FORM = re.compile(r"^(\d+)(\[\*\]|\[i\])?(?::([a-z]+))?$")
_MEETS: dict[str, frozenset[str]] = {
    "ok": frozenset({"SUCCEEDED"}),
    "any": frozenset(FINAL),
    "failed": frozenset({"FAILED", "BUDGET_EXHAUSTED"}),
}
_WANTS = {"ok": "succeed", "any": "end", "failed": "fail"}
_CONDS: dict[str, Condition] = {c: c for c in CONDITIONS}
_SCOPES: dict[str, Scope] = {"": "job", "[*]": "all", "[i]": "same"}


@dataclass(frozen=True, slots=True)
class AfterRef:
    """One `after:` entry: the job (or array) id, what of it is meant, and the condition."""

    id: int
    scope: Scope
    condition: Condition


def parse_after(text: str) -> AfterRef:
    """`12:ok` -> AfterRef(12, "job", "ok"). Raises ValueError saying what is allowed."""
    m = _FORM.match(text.strip())
    if m is None:
        raise ValueError(f"must be {AFTER_HELP} (got {text!r})")
    cond = _CONDS.get(m.group(3) or "ok")
    if cond is None:
        raise ValueError(f"condition must be one of {', '.join(CONDITIONS)} (got {m.group(3)!r} in {text!r})")
    if int(m.group(1)) < 1:
        raise ValueError(f"job ids start at 1 (got {text!r})")
    return AfterRef(int(m.group(1)), _SCOPES[m.group(2) or ""], cond)


@dataclass(frozen=True, slots=True)
class DependencyState:
    """`met`: every dependency is met; else `never` names one that can never be met (the job
    ends), or `waiting` says what it waits for."""

    met: bool
    waiting: str = ""
    never: str = ""


def resolve(after: Sequence[tuple[int, str]], states: Mapping[int, str]) -> DependencyState:
    """Where a job with dependencies `after` ([(job_id, condition)]) stands, given the states
    of the jobs it names (a job missing from `states` no longer exists: never met)."""
    waiting: list[str] = []
    for jid, cond in after:
        state = states.get(jid)
        if state is None:
            return DependencyState(False, never=f"job {jid} does not exist (needed to {_WANTS[cond]})")
        if state in _MEETS[cond]:
            continue
        if state in FINAL:
            return DependencyState(False, never=f"job {jid} ended {state}; this job needed it to "
                                                f"{_WANTS[cond]} (after {jid}:{cond})")
        waiting.append(f"job {jid} to {_WANTS[cond]}")
    if not waiting:
        return DependencyState(True)
    more = f" (and {len(waiting) - 1} more)" if len(waiting) > 1 else ""
    return DependencyState(False, waiting=f"waiting for {waiting[0]}{more}")

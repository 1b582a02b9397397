"""Validation of the job filters `status` / `list` take (shared by the SDK and the fast reader),
so `onepool status --status BOGUS` is an error naming the allowed values, not an empty table."""

from __future__ import annotations

from collections.abc import Iterable

from broker.errors import SpecError
from broker.state.states import JobState


def check_filters(status: Iterable[str] | None, team: str | None,
                  teams: list[str] | None, field: str = "status") -> list[str]:
    """The job states to select (as stored), after checking the filters: every status must be a
    job state (any case), the team one of `teams` (when known). Raises SpecError naming each
    bad filter (the states as `field`: the caller's name for them) and what is allowed."""
    problems = []
    states = [str(x).upper() for x in status or []]
    allowed = [s.value for s in JobState]
    bad = [x for x in states if x not in allowed]
    if bad:
        problems.append(f"{field}: must be one of {', '.join(a.lower() for a in allowed)} "
                        f"(got {', '.join(repr(b.lower()) for b in bad)})")
    if team is not None and teams is not None and team not in teams:
        problems.append(f"team: must be one of {', '.join(teams)} (got {team!r})")
    if problems:
        raise SpecError("filter", problems)
    return states

"""Who may do what (issue 28): the one rule, pure (no database), that the SDK applies for both
modes (embedded and behind the API) and that README's "Who can do what" table states.

Principals (broker.state.tokens.Principal):

- admin (an admin token, the embedded local user, the broker itself): everything, every team;
- lead (a team lead's token): every job of its team;
- member with a user (`onepool token create --team nlp --user alice`): reads its team's jobs,
  changes (cancel, update, hold, release) its own jobs only;
- member without a user (a token made before people existed, or a shared team token): acts as
  its whole team, as every member token did before: changes any job of its team;
- metrics and agent credentials never reach these rules (their routes check them).

| action        | member (own jobs) | member (team's other jobs) | team token (no user) | lead | admin |
|---------------|-------------------|----------------------------|----------------------|------|-------|
| READ          | yes               | yes                        | yes                  | yes  | all   |
| SUBMIT        | its team          | -                          | its team             | team | any   |
| CHANGE        | yes               | no                         | yes                  | yes  | all   |
| JOB_BUDGET    | no                | no                         | no                   | yes  | all   |
| CLUSTER       | yes               | yes                        | yes                  | yes  | yes   |
| ADMIN         | no                | no                         | no                   | no   | yes   |

READ: a job, its events, logs, costs and lost work; SUBMIT: queue a job for a team; CHANGE:
cancel, update (priority, budget), hold, release; JOB_BUDGET: override a job's budget without the
submit checks (`onepool budget set JOB`); CLUSTER: what every token sees of the cluster (pools,
nodes with other teams' jobs hidden, teams, the applied config, whoami, estimates); ADMIN: apply
a config, team budgets, tokens, join tokens. Another team's job is never READ: it is NotFound,
with the message of a job that does not exist.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING

from broker.errors import Forbidden, NotFound, SpecError

if TYPE_CHECKING:
    from broker.state.tokens import Principal


USER_HELP = "1 to 63 letters, digits, '.', '_', '-' or '@', starting with a letter or digit"
_USER = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,62}$")


def check_user(user: str | None, source: str = "token") -> str | None:
    """`user` if it is a valid person's name (or None). Raises SpecError naming the field."""
    if user is not None and not _USER.match(user):
        raise SpecError(source, [f"user: must be {USER_HELP} (got {user!r})"])
    return user


class Action(StrEnum):
    READ = "read"
    SUBMIT = "submit"
    CHANGE = "change"
    JOB_BUDGET = "job_budget"
    CLUSTER = "cluster"
    ADMIN = "admin"


def allowed(p: Principal, action: Action, team: str | None = None, owner: str | None = None) -> bool:
    """Whether `p` may do `action` on a job (or, for SUBMIT, for a team) of `team` submitted by
    `owner` (the job's user; None: submitted by a token without a user). `team` None: an action
    on no job (CLUSTER, ADMIN, or a read scoped to the principal's own team)."""
    if p.is_admin:
        return True
    if p.kind not in ("member", "lead"):
        return False
    if action is Action.ADMIN:
        return False
    if action is Action.CLUSTER:
        return True
    if team is not None and team != p.team:
        return False
    if action in (Action.READ, Action.SUBMIT):
        return True
    if action is Action.JOB_BUDGET:
        return p.kind == "lead"
    # CHANGE: a lead, a token without a user (the whole team), or the job's own submitter.
    return p.kind == "lead" or p.user is None or (owner is not None and owner == p.user)


def require(p: Principal, action: Action, what: str, team: str | None = None,
            owner: str | None = None, job_id: int | None = None) -> None:
    """Raise unless allowed(p, action, team, owner): NotFound (with the message of a job that
    does not exist) for a job of another team, Forbidden naming who may otherwise. `what`
    names the request in the message ("cancelling job 7")."""
    if allowed(p, action, team, owner):
        return
    if job_id is not None and team is not None and not allowed(p, Action.READ, team):
        raise NotFound(f"no job with id {job_id}")
    if action is Action.ADMIN:
        raise Forbidden(f"{what} needs an admin token (this token is a {p.kind} of team {p.team})")
    if action is Action.JOB_BUDGET:
        raise Forbidden(f"{what} needs the team lead's or an admin token (this token is a {p.kind} "
                        f"of team {p.team}); a job's submitter may change its budget with "
                        "`onepool update JOB --budget-usd X`")
    if action is Action.CHANGE:
        raise Forbidden(f"{what}: this token is {p.user}'s and the job was submitted by "
                        f"{owner or 'a team token'}; ask them, the team lead or an admin")
    raise Forbidden(f"{what}: this token acts for team {p.team} only (not {team})")

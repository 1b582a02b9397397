"""A submit's `after:` resolved against the database (issue 29): each entry names jobs that exist
(and that the submitter may see), so a job only ever waits for jobs submitted before it and no
cycle can form. The forms and the rule that later decides are in broker.policy.dependencies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlmodel import Session, select

from broker.errors import NotFound, SpecError
from broker.policy.dependencies import parse_after
from broker.spec import JobSpec
from broker.state.model import Job

if TYPE_CHECKING:
    from broker.client.sdk import Client

MAX_DEPS = 1000  # jobs one job may wait for


def resolve_after(s: Session, client: Client, js: JobSpec, indices: list[int]) -> list[list[list[Any]]]:
    """For each element of the submit (by its array index; -1: a plain job), the
    [[job_id, condition], ...] it waits for. Raises SpecError naming `after` for a job or array
    that does not exist (or an index the other array lacks), Forbidden for another team's job."""
    out: list[list[list[Any]]] = [[] for _ in indices]
    for text in js.after:
        ref = parse_after(text)
        if ref.scope == "job":
            try:
                client._job(s, ref.id)
            except NotFound:
                raise SpecError("job", [f"after: no job with id {ref.id} (got {text!r}); a job can "
                                        "only wait for one submitted before it"]) from None
            for deps in out:
                deps.append([ref.id, ref.condition])
            continue
        members = {j.array_index: j for j in s.exec(select(Job).where(Job.array_id == ref.id)).all()}
        if not members:
            raise SpecError("job", [f"after: no array with id {ref.id} (got {text!r}; an array is "
                                    "named by its first element's id)"])
        client.principal.require_team(next(iter(members.values())).team, f"waiting for array {ref.id} of")
        for index, deps in zip(indices, out, strict=True):
            if ref.scope == "all":
                deps.extend([j.id, ref.condition] for _, j in sorted(members.items()))
            elif index not in members:
                raise SpecError("job", [f"after: array {ref.id} has no element with index {index} "
                                        f"(got {text!r}; it has {len(members)} elements)"])
            else:
                deps.append([members[index].id, ref.condition])
    if out and len(out[0]) > MAX_DEPS:
        raise SpecError("job", [f"after: names {len(out[0])} jobs; at most {MAX_DEPS} (wait for an array "
                                "with ARRAY[*] only when it is that small)"])
    return out

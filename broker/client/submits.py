"""Submits written in batches: what the submits of one transaction read once (SubmitBatch),
a submit checked but not written yet (StagedSubmit, made by Client.stage_submit), and the
writing of a batch of them (write_submits). The API's group commit (broker/api/batcher.py)
and the embedded Client.submit both go through here."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import insert
from sqlmodel import Session, col, select

from broker.checkpoint.checkpoints import job_prefix
from broker.control import budgets as budget_rules
from broker.control.config_apply import applied_config
from broker.spec import ClusterConfig, JobSpec
from broker.state.events import event_row
from broker.state.model import Event, Job
from broker.state.model_access import IdempotentSubmit
from broker.state.tokens import Principal
from broker.state.views import JobInfo

if TYPE_CHECKING:
    from broker.client.sdk import Client


@dataclass
class SubmitBatch:
    """What the submits of one transaction share, read once: the applied config, the teams
    with a budget override, the Idempotency-Keys of the batch committed before (by (actor,
    key): (request digest, job id)), and the submits staged so far (by (actor, key))."""

    cfg: ClusterConfig
    overridden: set[str]
    committed: dict[tuple[str, str], tuple[str, int]]
    staged: dict[tuple[str, str], StagedSubmit] = field(default_factory=dict)

    @classmethod
    def read(cls, s: Session, keys: list[tuple[Principal, str | None]]) -> SubmitBatch:
        """Read what a batch with these (principal, Idempotency-Key) pairs needs. Raises
        NotConfigured."""
        cfg = applied_config(s)
        wanted = {(p.actor[:64], k) for p, k in keys if k is not None}
        committed: dict[tuple[str, str], tuple[str, int]] = {}
        if wanted:
            rows = s.exec(select(IdempotentSubmit.principal, IdempotentSubmit.key,
                                 IdempotentSubmit.request_sha256, IdempotentSubmit.job_id).where(
                col(IdempotentSubmit.principal).in_({a for a, _ in wanted}),
                col(IdempotentSubmit.key).in_({k for _, k in wanted}))).all()
            committed = {(a, k): (sha, job) for a, k, sha, job in rows if (a, k) in wanted}
        return cls(cfg, budget_rules.overridden_teams(s), committed)


@dataclass
class StagedSubmit:
    """A submit checked by Client.stage_submit and not written yet: a new `job` (with its
    spec), or a replay of the job an earlier submit with the same Idempotency-Key made
    (`prior`: committed before; `same_as`: earlier in the same batch)."""

    client: Client
    digest: str
    js: JobSpec | None = None
    job: Job | None = None
    key: str | None = None
    budget_note: str | None = None
    store_root: str = ""
    prior: int | None = None
    same_as: StagedSubmit | None = None
    more: list[Job] = field(default_factory=list)  # an array's other elements (issue 29)


def write_submits(s: Session, staged: list[StagedSubmit]) -> list[JobInfo]:
    """Write a batch of staged submits into the caller's transaction (their jobs in one
    insert, then their events and idempotency keys) and return each submit's job, in order.
    Nothing is durable until the caller commits; raises what the database raises."""
    new = [st for st in staged if st.job is not None]
    s.add_all([j for st in new if st.job is not None for j in (st.job, *st.more)])
    s.flush()  # the jobs' ids (one INSERT ... RETURNING for the batch)
    infos: dict[int, JobInfo] = {}
    events: list[dict[str, Any]] = []
    keys: list[dict[str, Any]] = []
    for st in new:
        job, js = st.job, st.js
        assert job is not None and job.id is not None and js is not None
        actor, now = st.client.principal.actor, job.submit_time
        elements = [job, *st.more]
        for el in elements:
            assert el.id is not None
            el.checkpoint_uri = job_prefix(st.store_root, js.team, js.experiment, el.id)
            if el.array_index is not None:
                el.array_id = job.id  # an array is named by its first element's id
            where = "" if el.array_index is None else f", element {el.array_index} of array {job.id}"
            events.append(event_row(now, "submitted", f"{js.priority.value} job, {js.nodes}x"
                                    f"{js.gpus_per_node} GPUs, team {js.team}{where}", actor, job_id=el.id))
        if st.budget_note:
            events += [event_row(now, "budget_spot_only", st.budget_note, actor, job_id=el.id)
                       for el in elements]
        if st.key is not None:
            keys.append({"principal": actor[:64], "key": st.key, "request_sha256": st.digest,
                         "job_id": job.id, "created_at": now})
        infos[id(st)] = JobInfo.of(job, [], now, stores=[], caused_lost_gpu_s=0.0)
    for model, rows in ((Event, events), (IdempotentSubmit, keys)):
        if rows:
            s.execute(insert(model), rows)  # one executemany each, no objects to track
    out: list[JobInfo] = []
    for st in staged:
        if st.same_as is not None:
            out.append(infos[id(st.same_as)])
        elif st.prior is not None:
            out.append(st.client._info(s, st.prior))
        else:
            out.append(infos[id(st)])
    return out

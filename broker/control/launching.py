"""Starting a placement (the engine's launch step; Engine inherits it): the attempt row is
written LAUNCHING and committed, with its slots, restore point (the newest intact checkpoint,
copied into the attempt's store if it lives elsewhere) and code snapshot, before any rank
starts; then each rank is started with its environment (ONEPOOL_*, CUDA_VISIBLE_DEVICES, the
output cap, the container settings), kept rank by rank so a later failure kills the earlier
ones. A failure before the row is written leaves the job pending; after, it fails that attempt
alone (broker.control.guards).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sqlmodel import Session, col, select

from broker.checkpoint import index as ckpt_index
from broker.checkpoint.checkpoints import job_prefix
from broker.checkpoint.resume import RestorePoint, fetch_restore_point
from broker.control import intervals
from broker.control.code_follow import code_env
from broker.control.guards import BROKER_FAILURES, AttemptGuards
from broker.crashpoints import crash_point
from broker.output_log import CAP_ENV, per_rank_cap
from broker.policy import Placement
from broker.spec import ClusterConfig
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, Job, JobState, Node
from providers.container import container_env

if TYPE_CHECKING:
    from broker.control.engine import CycleReport

log = logging.getLogger("onepool.engine")


class Launching(AttemptGuards):
    """The launch step of broker.control.engine.Engine (see the module docstring)."""

    config: ClusterConfig
    interval_inputs: intervals.CycleInputs

    def _launch(self, pl: Placement, now: float, rep: CycleReport) -> None:
        """Start a placement. A failure before its attempt row is committed leaves the job
        pending (the reason shown as why it waits); after, it fails that attempt alone."""
        written: list[int] = []
        try:
            self._launch_one(pl, now, rep, written)
        except BROKER_FAILURES:
            raise
        except Exception as e:
            log.exception("job %s: launch failed", pl.job_id)
            if written:
                self._fail_attempt(written[0], f"launch: {type(e).__name__}: {e}")
            else:
                self._launch_deferred(pl.job_id, now, f"{type(e).__name__}: {e}")

    def _launch_one(self, pl: Placement, now: float, rep: CycleReport, written: list[int]) -> None:
        with self.store.session() as s:
            job = s.get(Job, pl.job_id)
            if job is None or job.state != JobState.PENDING or job.cancel_requested:
                return
            if self._previous_alive(s, job, now):
                return
            slots = self._free_slots(s, pl)
            root = ckpt_index.pool_store_root(self.config, pl.pool, self.store.home)
            target = job_prefix(root, job.team, job.experiment, job.id)
            rp = self._restore_point(s, job, target, now)
            # Claim the job: a row an API process is changing right now (a cancel, a budget)
            # is skipped this cycle instead of waited for (PostgreSQL; SQLite has one writer).
            job = s.exec(select(Job).where(Job.id == pl.job_id, Job.state == JobState.PENDING,
                                           col(Job.cancel_requested).is_(False))
                         .with_for_update(skip_locked=True)
                         .execution_options(populate_existing=True)).first()
            if job is None:
                return
            a = Attempt(job_id=job.id, number=job.attempts + 1, pool=pl.pool,
                        alloc=[[node, slots[node]] for node, _ in pl.alloc],
                        priority=pl.priority.value, started_at=now, gpus=sum(g for _, g in pl.alloc),
                        restored_step=rp.step, checkpoint_uri=target, restore_bytes=rp.bytes,
                        egress_bytes=rp.egress_bytes, egress_usd=rp.egress_usd)
            job.state, job.attempts = JobState.RUNNING, job.attempts + 1
            job.wait_s += max(0.0, now - job.queued_at)
            job.waiting_reason, job.checkpoint_uri = None, target
            intervals.at_start(s, self.config, job, self.interval_inputs, now)  # [issue 31 hook]
            s.add(a)
            s.add(job)
            s.flush()
            if rp.copy is not None:
                ckpt_index.record_copy(s, job, a, rp.copy.manifest, root, now)
            for store_root, step in rp.damaged:
                ckpt_index.mark_damaged(s, job.id, store_root, step)
            for kind, msg, data in rp.events:
                record(s, now, kind, msg, job_id=job.id, attempt_id=a.id, **data)
            s.commit()  # LAUNCHING is durable before any process starts
            written.append(a.id or 0)
            crash_point("launch")
            self.store.ensure()
            if not self._start_or_fail(s, a, job, now, recover=False):
                return
            a.state = AttemptState.RUNNING
            where = ", ".join(f"{node}[{','.join(map(str, sl))}]" for node, sl in a.alloc)
            record(s, now, "started", f"attempt {a.number} on {pl.pool}: {where}"
                   + (f"; resuming from step {rp.step}" if rp.step is not None else ""),
                   job_id=job.id, attempt_id=a.id, pool=pl.pool, restored_step=rp.step,
                   priority=pl.priority.value, store=root, egress_bytes=rp.egress_bytes,
                   egress_usd=rp.egress_usd)
            s.add(a)
            rep.started.append(job.id)

    def _restore_point(self, s: Session, job: Job, target: str, now: float) -> RestorePoint:
        """The newest intact checkpoint, copied into `target` if it lives elsewhere."""
        if job.attempts == 0:
            return RestorePoint()
        return fetch_restore_point(ckpt_index.job_prefixes(s, job), target, now=now,
                                   locate=lambda root: ckpt_index.locate(self.config, root))

    def _free_slots(self, s: Session, pl: Placement) -> dict[str, list[int]]:
        used: dict[str, set[int]] = {}
        for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)).all():
            for node, slots in a.alloc:
                used.setdefault(node, set()).update(slots)
        out = {}
        for node, g in pl.alloc:
            row = s.get(Node, node)
            assert row is not None, node
            free = [i for i in range(row.gpus) if i not in used.get(node, set())]
            out[node] = free[:g]
        return out

    def _start_ranks(self, a: Attempt, job: Job, *, recover: bool) -> None:
        pool = self.config.pool(a.pool)
        handles = list(a.handles)
        code = code_env(job, ckpt_index.attempt_prefix(job, a), charge=(a, self.config, self.clock.now()))
        for rank, (node, slots) in enumerate(a.alloc):
            if rank < len(handles):
                continue
            env = {**job.env,
                   "ONEPOOL_JOB_ID": str(job.id), "ONEPOOL_ATTEMPT": str(a.number), "ONEPOOL_TEAM": job.team,
                   "ONEPOOL_RANK": str(rank), "ONEPOOL_WORLD_SIZE": str(len(a.alloc)),
                   "ONEPOOL_CHECKPOINT_URI": ckpt_index.attempt_prefix(job, a),
                   "ONEPOOL_RESTORE_STEP": "" if a.restored_step is None else str(a.restored_step),
                   "ONEPOOL_GRACE_S": f"{self.settings.grace_s:g}",
                   "ONEPOOL_CHECKPOINT_INTERVAL_S": f"{job.checkpoint_interval_s:g}",
                   "ONEPOOL_POOL": pool.name, "ONEPOOL_PROVIDER": pool.provider,
                   "ONEPOOL_REGION": pool.region, "ONEPOOL_GPU_TYPE": pool.gpu_type,
                   CAP_ENV: str(per_rank_cap(self.settings.output_cap_bytes, len(a.alloc))),
                   "CUDA_VISIBLE_DEVICES": ",".join(map(str, slots))}
            env.update(code)  # its code snapshot (issue 26), in the attempt's store
            if job.workdir:
                env["ONEPOOL_WORKDIR"] = job.workdir
            env.update(container_env(job.image, pool.container_runtime))
            handles.append(self.executor.start(a.id, rank, list(job.command), env, recover=recover,
                                               node=node))
            a.handles = list(handles)  # kept rank by rank: a later rank's failure kills these
            crash_point("launch")

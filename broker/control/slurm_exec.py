"""SlurmExecutor: the Executor contract (providers.base) for attempts in Slurm pools.

An attempt is ONE Slurm job (providers.slurm.script): one allocation of all its nodes, one
rank per node through srun. The engine starts ranks one by one; the first rank's start()
submits the allocation for all of them (it reads the attempt's nodes from the database) and
the other ranks attach to it. Every handle names the job two ways: its Slurm id, and its
name `onepool-<broker>-a<attempt>`, unique per broker home.

- start() is idempotent per attempt: a second call returns the same job; with recover=True
  (after a broker restart) it first looks the name up in Slurm (squeue, else sacct or the
  jobcomp log) and adopts a job a crashed broker had submitted, so nothing runs twice. If
  sbatch timed out (outcome unknown), the handle carries only the name, and status()
  resolves it later: found, it is adopted; not found, it is cancelled by name (in case it
  lands late) and reported ended. If Slurm rejected the submission, the pool takes no new
  work for REJECTED_BACKOFF_S, and the attempt ends and goes back to the queue.
- status(): RUNNING while Slurm runs it (or has it queued, up to the pool's
  start_timeout_s; after that it is cancelled: someone else got the GPUs first). Ended: the
  exit status, with a `cause` when Slurm, not the job, ended it: slurm_preempted,
  slurm_requeued (cancelled at once; onepool requeues the job itself), slurm_cancelled,
  slurm_time_limit, slurm_start_timeout, slurm_rejected, slurm_submit_failed; a node
  failure is LOST with cause node_failure; a rank its wrapper could not start (exit codes
  providers.slurm.script.START_EXIT) carries start_failed:<kind>. Slurm unreachable:
  RUNNING (unknown; asked again next cycle). A job no source remembers: LOST.
- signal(): SIGKILL cancels the job (`scancel`); other signals go to every rank
  (`scancel --signal`); SIGTERM to a job whose ranks have not started yet (queued, or its
  srun step not there yet) cancels it: nothing to checkpoint, and a signal would reach no rank. A job that
  has ended is ignored, and so (with a warning) is Slurm being unreachable: the engine
  signals again (the kill after the grace period, and on reconcile).
"""

from __future__ import annotations

import logging
import signal as signals
import time
from typing import TYPE_CHECKING

from broker.codepack import SHA_ENV
from broker.spec_types import SLURM_RUNTIMES
from broker.state.events import record
from broker.state.model import Attempt, Job
from providers import start_errors
from providers.base import Handle, ProviderError, RankState, RankStatus, StartFailed
from providers.container import IMAGE_ENV, RUNTIME_ENV
from providers.data_cache import DATA_ENV
from providers.setup_runner import SETUP_ENV
from providers.slurm import JobRecord, SlurmCluster, SlurmParseError, SlurmRejected
from providers.slurm.parse import Outcome, exit_status, outcome
from providers.slurm.script import START_EXIT, Submission, batch_script, in_container

if TYPE_CHECKING:
    from broker.control.slurm_pools import SlurmPools

log = logging.getLogger("onepool.slurm")
SLURM = "slurm"
REJECTED_BACKOFF_S = 300.0
STATUS_MAX_AGE_S = 1.0  # status() reuses a squeue listing this young (one per cycle)
UNSUPPORTED = "code_unsupported"
START_KINDS = {code: kind for kind, code in START_EXIT.items()}
CAUSES = {Outcome.PREEMPTED: "slurm_preempted", Outcome.REQUEUED: "slurm_requeued",
          Outcome.CANCELLED: "slurm_cancelled", Outcome.TIME_LIMIT: "slurm_time_limit"}


class SlurmExecutor:
    def __init__(self, pools: SlurmPools) -> None:
        self.pools = pools
        self._jobs: dict[int, dict[str, object]] = {}  # attempt id -> {job_id, submitted_at, ...}
        self._final: dict[str, RankStatus] = {}  # Slurm job id -> how it ended
        self._resolved: dict[str, str] = {}  # job name -> id (handles made before the id was known)
        self._sent: dict[tuple[str, int], float] = {}  # (job id, signal) -> monotonic time sent

    # -- start ----------------------------------------------------------------------------------
    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False, node: str | None = None) -> Handle:
        """Submit the attempt's allocation (first call) or attach to it; see the module doc.
        Raises StartFailed (`start_failed:code_unsupported`) for a job that ships code, setup or
        data (issue 26): a Slurm pool does not unpack them yet."""
        if any(env.get(k) for k in (SHA_ENV, SETUP_ENV, DATA_ENV)):
            why = start_errors.cause(UNSUPPORTED)
            raise StartFailed(f"rank {rank} could not start: {start_errors.describe(why)}", cause=why)
        with self.pools.store.session() as s:
            a = s.get(Attempt, attempt_id)
            job = s.get(Job, a.job_id) if a is not None else None
            if a is None or job is None:
                raise ValueError(f"attempt {attempt_id} is not in the database")
            pool, alloc, number, job_id = a.pool, [tuple(x) for x in a.alloc], a.number, job.id
        name = self._name(attempt_id)
        if env.get(IMAGE_ENV) and env.get(RUNTIME_ENV) not in SLURM_RUNTIMES:  # refused at submit,
            kind = "no_container_runtime"  # unless a config change took the pool's runtime away
            raise StartFailed(f"pool {pool} names no container runtime for the job's image",
                              cause=start_errors.cause(kind))
        if attempt_id not in self._jobs:
            self._jobs[attempt_id] = self._submit(pool, attempt_id, number, job_id, alloc, argv, env,
                                                  name, lookup=recover or rank > 0)
        return {"kind": SLURM, "pool": pool, "attempt_id": attempt_id, "rank": rank, "name": name,
                **self._jobs[attempt_id]}

    def _name(self, attempt_id: int) -> str:
        from broker.control.slurm_pools import job_name

        return job_name(self.pools.broker, attempt_id)

    def _submit(self, pool: str, attempt_id: int, number: int, job_id: int | None,
                alloc: list[tuple], argv: list[str], env: dict[str, str], name: str,
                lookup: bool) -> dict[str, object]:
        from broker.control.slurm_pools import slurm_node

        now = self.pools.clock.now()
        cluster = self.pools.cluster(pool)
        spec = self.pools.spec(pool).slurm
        assert spec is not None
        if lookup:
            try:
                found = cluster.find(name)
            except (ProviderError, SlurmParseError) as e:
                log.warning("attempt %s: cannot look up Slurm job %s now (%s); resolved later",
                            attempt_id, name, e)
                return {"job_id": None, "submitted_at": now}
            if found is not None:
                log.info("attempt %s: adopted Slurm job %s (%s)", attempt_id, found, name)
                return {"job_id": found, "submitted_at": now}
        srun_extra: tuple[str, ...] = ()
        if env.get(IMAGE_ENV):
            srun_extra, argv_t = in_container(env[RUNTIME_ENV], env[IMAGE_ENV], tuple(argv),
                                              env.get("ONEPOOL_WORKDIR"))
            argv = list(argv_t)
        sub = Submission(
            name=name, comment=f"onepool:broker={self.pools.broker},job={job_id},attempt={attempt_id},"
                               f"number={number},pool={pool}",
            partition=spec.partition, account=spec.account, qos=spec.qos,
            nodes=tuple(slurm_node(pool, n) for n, _ in alloc), gpus_per_node=len(alloc[0][1]),
            gres_type=spec.gres_type, argv=tuple(argv),
            env={**env, "ONEPOOL_ATTEMPT_ID": str(attempt_id)}, output_dir=self.pools.output_dir(pool),
            attempt_id=attempt_id, signal_before_s=int(float(env.get("ONEPOOL_GRACE_S", "60")) or 60),
            workdir=env.get("ONEPOOL_WORKDIR"), cpus_per_gpu=spec.cpus_per_gpu,
            mem_per_gpu=spec.mem_per_gpu, time_limit=spec.time_limit, srun_extra=srun_extra)
        try:
            jid = cluster.submit(batch_script(sub), sub.attempt_dir)
        except SlurmRejected as e:
            self.pools.close(pool, now + REJECTED_BACKOFF_S)
            self._event(now, "slurm_rejected", f"Slurm refused attempt {number}: {e}; pool {pool} takes "
                        f"no new work for {REJECTED_BACKOFF_S:g}s", job_id, attempt_id, pool=pool)
            return {"job_id": None, "submitted_at": now, "error": str(e)[:500]}
        except (ProviderError, SlurmParseError) as e:  # unknown outcome: resolve by name later
            log.warning("attempt %s: sbatch on %s: %s; resolved by name later", attempt_id, cluster.where, e)
            return {"job_id": None, "submitted_at": now}
        log.info("attempt %s: Slurm job %s on %s", attempt_id, jid, ",".join(sub.nodes))
        return {"job_id": jid, "submitted_at": now}

    def _event(self, now: float, kind: str, msg: str, job_id: int | None, attempt_id: int,
               **data: object) -> None:
        with self.pools.store.session() as s:
            record(s, now, kind, msg, job_id=job_id, attempt_id=attempt_id, **data)

    # -- status ---------------------------------------------------------------------------------
    def status(self, handle: Handle) -> RankStatus:
        if handle.get("error"):
            return RankStatus(RankState.EXITED, None, cause="slurm_rejected")
        pool = str(handle["pool"])
        try:
            jid = self._job_id(handle)
            if jid is None:  # sbatch's outcome was unknown and Slurm has no such job
                self.pools.cluster(pool).cancel_named(str(handle["name"]))  # in case it lands late
                return RankStatus(RankState.EXITED, None, cause="slurm_submit_failed")
            if jid in self._final:
                return self._final[jid]
            st = self._status(pool, jid, handle)
        except (ProviderError, SlurmParseError) as e:
            log.warning("slurm job of attempt %s: state unknown now (%s)", handle.get("attempt_id"), e)
            return RankStatus(RankState.RUNNING)
        if st.state != RankState.RUNNING:
            self._final[jid] = st
            if st.cause in ("slurm_preempted", "slurm_requeued"):
                self.pools.hold_after_preemption(int(handle["attempt_id"]), self.pools.clock.now())
        return st

    def _job_id(self, handle: Handle) -> str | None:
        jid = handle.get("job_id")
        if jid:
            return str(jid)
        name = str(handle["name"])
        if name not in self._resolved:
            found = self.pools.cluster(str(handle["pool"])).find(name)
            if found is None:
                return None
            self._resolved[name] = found
        return self._resolved[name]

    def _status(self, pool: str, jid: str, handle: Handle) -> RankStatus:
        j = self.pools.jobs(pool, STATUS_MAX_AGE_S).get(jid)
        cluster = self.pools.cluster(pool)
        if j is not None:
            out = outcome(j.state, j.restarts)
            if out == Outcome.RUNNING:
                return RankStatus(RankState.RUNNING)
            if out == Outcome.QUEUED:
                waited = self.pools.clock.now() - float(handle.get("submitted_at") or 0.0)
                if waited < self.pools.spec(pool).slurm.start_timeout_s:  # type: ignore[union-attr]
                    return RankStatus(RankState.RUNNING)
                cluster.cancel(jid)
                return RankStatus(RankState.EXITED, None, cause="slurm_start_timeout")
        rec = cluster.record(jid)
        if rec is None:
            return RankStatus(RankState.LOST)
        return self._ended(cluster, jid, rec)

    @staticmethod
    def _ended(cluster: SlurmCluster, jid: str, rec: JobRecord) -> RankStatus:
        out = outcome(rec.state, rec.restarts, rec.exit_code)
        code = exit_status(rec.exit_code, rec.signal)
        if out in (Outcome.RUNNING, Outcome.QUEUED):  # squeue and scontrol disagree for a moment
            return RankStatus(RankState.RUNNING)
        if out == Outcome.DONE:
            return RankStatus(RankState.EXITED, 0)
        if out == Outcome.FAILED:
            kind = START_KINDS.get(code or 0)  # its rank wrapper could not start the command
            return RankStatus(RankState.EXITED, code or 1,
                              cause=None if kind is None else start_errors.cause(kind))
        if out == Outcome.NODE_FAILURE:
            return RankStatus(RankState.LOST, None, cause="node_failure")
        if out == Outcome.REQUEUED:
            cluster.cancel(jid)  # onepool requeues the job itself; the rerun must not start
        return RankStatus(RankState.EXITED, code or None, cause=CAUSES[out])

    # -- signal ---------------------------------------------------------------------------------
    def signal(self, handle: Handle, sig: int) -> None:
        if handle.get("error"):
            return
        pool = str(handle["pool"])
        cluster = self.pools.cluster(pool)
        try:
            jid = self._job_id(handle)
            if jid is None or jid in self._final:
                if jid is None and sig in (signals.SIGTERM, signals.SIGKILL):
                    cluster.cancel_named(str(handle["name"]))
                return
            key, t = (jid, int(sig)), time.monotonic()
            if t - self._sent.get(key, float("-inf")) < 0.5:  # the other ranks of the same job
                return
            self._sent[key] = t
            if sig == signals.SIGKILL:
                cluster.cancel(jid)
                return
            if sig != signals.SIGTERM:
                cluster.signal(jid, signals.Signals(sig).name.removeprefix("SIG"))
                return
            j = self.pools.jobs(pool, STATUS_MAX_AGE_S).get(jid) or self.pools.jobs(pool).get(jid)
            if j is None or outcome(j.state, j.restarts) == Outcome.QUEUED or not cluster.ranks_started(jid):
                cluster.cancel(jid)  # no rank runs yet: nothing to checkpoint
                return
            # to the ranks only: srun treats a TERM of its own as "kill the step now"
            cluster.signal(jid, "TERM")
        except (ProviderError, SlurmParseError) as e:
            log.warning("slurm job of attempt %s: signal %s not sent (%s); the engine sends it again",
                        handle.get("attempt_id"), sig, e)

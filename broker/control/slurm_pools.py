"""Slurm pools (`provider: slurm`): their clusters, and what Slurm says their nodes hold.

`SlurmPools.sync(now)` runs at the start of every engine cycle. Per Slurm pool it reads the
partition's nodes (sinfo: state, GPUs of the pool's GRES type, GPUs in use by anyone) and this
user's jobs (squeue), and writes them as the pool's Node rows (id `<pool>-<slurm node>`):
- `gpus`: the node's GPUs of the pool's type; `held_elsewhere`: the ones other Slurm users
  hold (in use, minus what this broker's running jobs hold there): not free to onepool. The
  GPUs of an attempt Slurm preempted or requeued count as held elsewhere until the work that
  took them shows up (at most PREEMPTED_HOLD_S), so onepool does not resubmit into them.
- state `up`, or `unavailable` when the node is drained, draining, down, not responding, out
  of the partition, or Slurm cannot be reached: nothing new lands there; attempts already
  there run on (Slurm ends them if the node fails) and are still charged.
The attempts themselves run through `SlurmPools.executor` (broker.control.slurm_exec).
Commands go through providers.slurm (one runner per pool, local or over SSH).
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from pathlib import Path

from sqlmodel import Session, select

from broker.clock import Clock
from broker.control.config_apply import applied_config
from broker.errors import NotConfigured
from broker.spec import PoolSpec
from broker.state.events import record
from broker.state.model import Attempt, Node, NodeState, Setting
from broker.state.store import Store
from providers.base import ProviderError
from providers.slurm import SlurmCluster, SlurmJob, SlurmParseError, make_cluster
from providers.slurm.parse import Outcome, gpus_in, outcome

log = logging.getLogger("onepool.slurm")
JOB_PREFIX = "onepool-"
PREEMPTED_HOLD_S = 30.0  # see SlurmPools.hold_after_preemption


def job_name(broker: str, attempt_id: int) -> str:
    """The Slurm job name of an attempt: unique per broker home, found again after a restart."""
    return f"{JOB_PREFIX}{broker}-a{attempt_id}"


def node_id(pool: str, slurm_node: str) -> str:
    return f"{pool}-{slurm_node}"


def slurm_node(pool: str, node: str) -> str:
    """The Slurm name of onepool node `node` of `pool` (inverse of node_id)."""
    return node.removeprefix(f"{pool}-")


class SlurmPools:
    """The Slurm pools of one broker home. `clusters` may be pre-filled (tests); otherwise one
    is built per pool from its `slurm:` settings."""

    def __init__(self, store: Store, clock: Clock,
                 clusters: dict[str, SlurmCluster] | None = None) -> None:
        from broker.control.slurm_exec import SlurmExecutor

        self.store, self.clock = store, clock
        self.clusters: dict[str, SlurmCluster] = dict(clusters or {})
        self.closed_until: dict[str, float] = {}  # pool -> until when nothing new lands there
        self._specs: dict[str, PoolSpec] | None = None
        self._broker: str | None = None
        self._jobs: dict[str, tuple[float, dict[str, SlurmJob]]] = {}  # pool -> (monotonic, jobs)
        self._holds: dict[str, tuple[int, float]] = {}  # node -> (GPUs, until): see hold_after_preemption
        self.executor = SlurmExecutor(self)

    # -- configuration --------------------------------------------------------------------------
    def specs(self, reload: bool = False) -> dict[str, PoolSpec]:
        """The Slurm pools of the applied config, read once (as the engine reads it) and again
        on `reload` ({} when none is applied)."""
        if reload or self._specs is None:
            try:
                with self.store.session() as s:
                    cfg = applied_config(s)
            except NotConfigured:
                return {}
            self._specs = {p.name: p for p in cfg.pools if p.provider == "slurm"}
        return self._specs

    def spec(self, pool: str) -> PoolSpec:
        spec = self.specs().get(pool) or self.specs(reload=True).get(pool)
        if spec is None:
            raise KeyError(f"pool {pool!r} is not a slurm pool of the applied config")
        return spec

    def cluster(self, pool: str) -> SlurmCluster:
        if pool not in self.clusters:
            self.clusters[pool] = make_cluster(self.spec(pool).slurm)  # type: ignore[arg-type]
        return self.clusters[pool]

    @property
    def broker(self) -> str:
        """This broker home's id (part of every job name), created once."""
        if self._broker is None:
            from broker.control.capacity_manager import broker_id

            with self.store.session() as s:
                self._broker = broker_id(s)
        return self._broker

    def output_dir(self, pool: str) -> str:
        spec = self.spec(pool).slurm
        assert spec is not None
        if spec.output_dir:
            return spec.output_dir
        return str(Path(self.store.home).resolve() / "runs") if spec.login is None else "onepool-runs"

    def jobs(self, pool: str, max_age_s: float = 0.0) -> dict[str, SlurmJob]:
        """This user's Slurm jobs by id, as squeue listed them at most `max_age_s` ago."""
        at, jobs = self._jobs.get(pool, (float("-inf"), {}))
        if time.monotonic() - at > max_age_s:
            jobs = {j.job_id: j for j in self.cluster(pool).jobs()}
            self._jobs[pool] = (time.monotonic(), jobs)
        return jobs

    def hold_after_preemption(self, attempt_id: int, now: float) -> None:
        """Slurm took this attempt's GPUs for other work, which may not have started yet (it
        does once they are free): count them as held elsewhere from now (this cycle's plan
        included) until Slurm shows that work holding them, or PREEMPTED_HOLD_S passed, so
        onepool does not submit into them again at once."""
        with self.store.session() as s:
            a = s.get(Attempt, attempt_id)
            if a is None:
                return
            for node, slots in a.alloc:
                self._holds[node] = (len(slots), now + PREEMPTED_HOLD_S)
                row = s.get(Node, node)
                if row is not None:
                    row.held_elsewhere = max(row.held_elsewhere, len(slots))
                    s.add(row)

    def _with_hold(self, node: str, held: int, now: float) -> int:
        gpus, until = self._holds.get(node, (0, 0.0))
        if until <= now or held >= gpus:  # expired, or Slurm shows the other work now
            self._holds.pop(node, None)
            return held
        return gpus

    def close(self, pool: str, until: float) -> None:
        """Nothing new lands in `pool` before `until` (after Slurm rejected a submission)."""
        self.closed_until[pool] = max(until, self.closed_until.get(pool, 0.0))

    # -- hook: Engine.cycle, before the poll ----------------------------------------------------
    def sync(self, now: float) -> None:
        """Refresh every Slurm pool's nodes from Slurm (see the module doc). Never raises for
        Slurm being unreachable: its nodes become unavailable until it answers again."""
        for pool, spec in self.specs().items():
            assert spec.slurm is not None
            gres_type = spec.slurm.gres_type
            try:
                # squeue before sinfo: a job of ours that ends between the two reads is then
                # still ours in `jobs`, and its GPUs are either still in use (and ours) or
                # already free in `nodes`. The other order saw them in use by a job already
                # listed as ended: held by someone else, for one cycle.
                jobs = self.jobs(pool)
                nodes = self.cluster(pool).nodes()
            except (ProviderError, SlurmParseError) as e:
                self._unreachable(pool, now, str(e))
                continue
            mine: dict[str, int] = defaultdict(int)
            prefix = f"{JOB_PREFIX}{self.broker}-"
            for j in jobs.values():
                if j.name.startswith(prefix) and outcome(j.state, 0) == Outcome.RUNNING:
                    for n in j.nodes:
                        mine[n] += gpus_in(list(j.gres_per_node), gres_type)
            closed = self.closed_until.get(pool, 0.0) > now
            seen: set[str] = set()
            with self.store.session() as s:
                self._reachable(s, pool, now)
                for sn in nodes:
                    gpus = sn.gpus(gres_type)
                    if gpus <= 0:
                        continue
                    nid = node_id(pool, sn.name)
                    seen.add(nid)
                    row = s.get(Node, nid) or Node(id=nid, pool=pool, gpus=gpus, state=NodeState.UNAVAILABLE)
                    state = NodeState.UP if sn.usable and not closed else NodeState.UNAVAILABLE
                    why = "closed after a rejected submission" if sn.usable else f"Slurm state {sn.state}"
                    held = max(0, sn.gpus_used(gres_type) - mine[sn.name])
                    self._set(s, row, gpus, self._with_hold(nid, held, now), state, now, why)
                for row in s.exec(select(Node).where(Node.pool == pool)).all():
                    if row.id not in seen:
                        self._set(s, row, row.gpus, 0, NodeState.UNAVAILABLE, now,
                                  f"no longer in partition {spec.slurm.partition} with GPUs of its type")

    @staticmethod
    def _set(s: Session, row: Node, gpus: int, held: int, state: str, now: float, why: str) -> None:
        if row.state != state:
            said = f"node {row.id} is {state}" + ("" if state == NodeState.UP else f": {why}")
            record(s, now, "slurm_node", said, node=row.id, pool=row.pool, state=state,
                   reason=None if state == NodeState.UP else why)
            log.info("slurm %s", said)
        row.gpus, row.held_elsewhere, row.state = gpus, held, state
        s.add(row)

    def _unreachable(self, pool: str, now: float, err: str) -> None:
        key = f"slurm_unreachable:{pool}"
        with self.store.session() as s:
            flag = s.get(Setting, key)
            if flag is None:
                s.add(Setting(key=key, value={"since": now, "error": err}))
                record(s, now, "slurm_unreachable", f"pool {pool}: {err}; its nodes take no new "
                       "work until Slurm answers", pool=pool, error=err)
                log.warning("slurm pool %s unreachable: %s", pool, err)
            for row in s.exec(select(Node).where(Node.pool == pool, Node.state == NodeState.UP)).all():
                row.state = NodeState.UNAVAILABLE
                s.add(row)

    @staticmethod
    def _reachable(s: Session, pool: str, now: float) -> None:
        flag = s.get(Setting, f"slurm_unreachable:{pool}")
        if flag is not None:
            s.delete(flag)
            record(s, now, "slurm_reachable", f"pool {pool}: Slurm answers again", pool=pool)

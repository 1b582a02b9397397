"""Rented capacity: the engine's hands for plan.launches / plan.terminations, interruption
notices, idle tracking and start-up reconciliation. Called from marked hooks in
broker.control.engine (reconcile, and twice per cycle: sync() before the snapshot, apply() after
the plan).

Jobs placed on a rented node still run as LOCAL processes here (the engine's Executor is
providers.local.LocalProcesses; there is no remote host in this environment): the cloud
instance is the capacity and billing object. Its user data carries the bootstrap that would
start the runner on a real host (providers.bootstrap).

Never twice. A launch first commits a LAUNCHING node row holding a fresh token, then calls
provider.launch(token). A broker that dies between the call and writing the instance id
finds the row on restart and calls launch again with the same token: the provider returns
the instance the first call made (ClientToken / request_id / a tag search).

Node lifecycle (broker.state.model.NodeState): launching -> up -> [draining] -> terminating ->
terminated. An interruption notice drains the node: its attempts checkpoint now and requeue
(Engine.interrupt); once empty it is terminated. A node the cloud lost while the database
thought it alive is ended and its attempts end LOST (requeued). An instance tagged by this
broker that the database does not know (or has ended) is an orphan: it is terminated.

A pool whose provider answered NoCapacity (or Fatal) is closed to launches for a while, and a
node under an interruption notice takes no new work: both rules live in broker.policy.pools
(the simulator applies the same ones), so the next plan falls through to the next-cheapest
offer.
"""

from __future__ import annotations

import logging
import signal
import uuid
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING

from sqlmodel import Session, col, select

from broker.policy import NodeView, Plan, Snapshot
from broker.policy.pools import capped, closed_until, draining
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, EndReason, Node, NodeState, Setting
from pricing.catalog import Catalog
from providers.base import (
    TAG_POOL,
    Fatal,
    Instance,
    InstanceState,
    LaunchRequest,
    NoCapacity,
    Provider,
    ProviderError,
    Transient,
)
from providers.bootstrap import user_data

if TYPE_CHECKING:
    from broker.control.engine import Engine
    from broker.spec import PoolSpec

log = logging.getLogger("onepool.capacity")
LOST_GRACE_S = 120.0  # a launching instance missing from the listing this long is lost
ALIVE = (NodeState.LAUNCHING, NodeState.UP, NodeState.DRAINING)


class CapacityManager:
    """One per engine. `providers` may be pre-filled (tests); otherwise built per pool."""

    def __init__(self, engine: Engine, providers: dict[str, Provider] | None = None,
                 catalog: Catalog | None = None) -> None:
        self.engine = engine
        self.pools: dict[str, PoolSpec] = {p.name: p for p in engine.config.pools if p.rented}
        self.providers: dict[str, Provider] = dict(providers or {})
        self._catalog = catalog
        self.closed_until: dict[str, float] = {}
        with engine.store.session() as s:
            self.broker_id = broker_id(s)

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.snapshot()
        return self._catalog

    def provider(self, pool: str) -> Provider:
        if pool not in self.providers:
            from providers.registry import make_provider

            self.providers[pool] = make_provider(self.pools[pool])
        return self.providers[pool]

    # -- hook: Engine.reconcile -----------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        """Terminate orphans, then sync (finishes launches, ends lost nodes)."""
        if not self.pools:
            return
        with self.engine.store.session() as s:
            nodes = {n.id: n for n in s.exec(select(Node).where(col(Node.pool).in_(list(self.pools))))}
            for pool in self.pools:
                for inst in self._poll(pool) or []:
                    if inst.tags.get(TAG_POOL) not in (pool, None):
                        continue
                    n = nodes.get(inst.node_id or "")
                    if n is not None and n.state in ALIVE and n.instance_id in (None, inst.instance_id):
                        if n.instance_id is None:  # launched, but the answer was never written
                            n.instance_id, n.zone = inst.instance_id, inst.zone
                            s.add(n)
                        continue
                    self._terminate_quietly(pool, inst.instance_id)
                    record(s, now, "orphan_terminated", f"instance {inst.instance_id} in {pool} "
                           f"(node {inst.node_id}) is not known alive to this broker: terminated",
                           pool=pool, instance_id=inst.instance_id, node=inst.node_id)
        self.sync(now)

    # -- hook: Engine.cycle, before the snapshot --------------------------------------------------
    def sync(self, now: float) -> None:
        """Finish launches, notice ready/lost nodes, act on interruptions, track idleness,
        terminate drained and half-terminated nodes."""
        if not self.pools:
            return
        with self.engine.store.session() as s:
            rows = s.exec(select(Node).where(col(Node.pool).in_(list(self.pools)),
                                             col(Node.state).in_([*ALIVE, NodeState.TERMINATING]))).all()
            by_pool: dict[str, list[Node]] = defaultdict(list)
            for n in rows:
                by_pool[n.pool].append(n)
        for pool, nodes in by_pool.items():
            seen = self._poll(pool)
            if seen is None:
                continue
            live = {i.instance_id: i for i in seen}
            for n in nodes:
                if n.state == NodeState.TERMINATING:
                    self._terminate_node(n.id, now, n.end_reason or "terminated")
                elif n.instance_id is None:
                    self._launch_node(n.id, now)
                elif n.instance_id not in live:
                    if n.state != NodeState.LAUNCHING or now - (n.launched_at or now) >= LOST_GRACE_S:
                        self._lost(n.id, now)  # (a fresh launch may not be listed yet)
                elif n.state == NodeState.LAUNCHING and live[n.instance_id].state == InstanceState.RUNNING:
                    self._set(n.id, state=NodeState.UP, ready_at=now, idle_since=now)
            self._interruptions(pool, now)
        self._idle_and_drained(now)

    def _poll(self, pool: str) -> list[Instance] | None:
        try:
            return [i for i in self.provider(pool).poll(self.broker_id)
                    if i.tags.get(TAG_POOL) in (pool, None)]
        except ProviderError as e:
            log.warning("pool %s: cannot list instances now (%s); next cycle tries again", pool, e)
            return None

    def _interruptions(self, pool: str, now: float) -> None:
        try:
            notices = self.provider(pool).interruptions()
        except ProviderError as e:
            log.warning("pool %s: cannot read interruption notices (%s)", pool, e)
            return
        for it in notices:
            with self.engine.store.session() as s:
                n = s.exec(select(Node).where(Node.instance_id == it.instance_id)).first()
                if n is None or n.state not in (NodeState.UP, NodeState.LAUNCHING):
                    continue
                n.state = NodeState.DRAINING
                s.add(n)
                record(s, now, "interruption_notice", f"{it.kind} for node {n.id} "
                       f"({it.instance_id}): draining", pool=pool, node=n.id, notice=it.kind)
                attempts = self._attempts_on(s, n.id)
            for a in attempts:
                self.engine.interrupt(a.id, it.kind)

    def _idle_and_drained(self, now: float) -> None:
        with self.engine.store.session() as s:
            busy = {node for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED))
                    for node, _ in a.alloc}
            drained = []
            for n in s.exec(select(Node).where(col(Node.pool).in_(list(self.pools)),
                                               col(Node.state).in_([NodeState.UP, NodeState.DRAINING]))):
                if n.state == NodeState.DRAINING and n.id not in busy:
                    drained.append(n.id)
                elif n.id in busy and n.idle_since is not None:
                    n.idle_since = None
                    s.add(n)
                elif n.id not in busy and n.idle_since is None:
                    n.idle_since = now
                    s.add(n)
        for nid in drained:
            self._terminate_node(nid, now, "interrupted")

    def _lost(self, node_id: str, now: float) -> None:
        """The cloud no longer has the node: end it; its attempts end LOST and requeue."""
        with self.engine.store.session() as s:
            n = s.get(Node, node_id)
            assert n is not None
            n.state, n.ended_at, n.end_reason = NodeState.TERMINATED, now, "lost"
            s.add(n)
            record(s, now, "node_lost", f"node {n.id} ({n.instance_id}) is gone from {n.pool}",
                   pool=n.pool, node=n.id)
            for a in self._attempts_on(s, node_id):
                for h in a.handles:  # the processes would have died with the node
                    self.engine.executor.signal(h, signal.SIGKILL)
                a.cause = a.cause or "node_lost"
                self.engine._end(s, a, now, EndReason.LOST, None)

    @staticmethod
    def _attempts_on(s: Session, node_id: str) -> list[Attempt]:
        return [a for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED))
                if any(node == node_id for node, _ in a.alloc)]

    # -- hook: Engine.cycle, after the plan -------------------------------------------------------
    def extend(self, snap: Snapshot, now: float) -> Snapshot:
        """Give the snapshot's rented pools their growth, launching nodes, idleness, price and
        interruption rate. Pools closed after NoCapacity/Fatal cannot grow."""
        if not self.pools:
            return snap
        with self.engine.store.session() as s:
            rows = s.exec(select(Node).where(col(Node.pool).in_(list(self.pools)),
                                             col(Node.state).in_(list(ALIVE))).order_by(Node.id)).all()
            held: dict[str, int] = defaultdict(int)
            for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)):
                for node, slots in a.alloc:
                    held[node] += len(slots)
        pools = []
        for p in snap.pools:
            spec = self.pools.get(p.name)
            if spec is None:
                pools.append(p)
                continue
            mine = [n for n in rows if n.pool == p.name]
            nodes = tuple(NodeView(n.id, n.gpus, idle_since=n.idle_since) if n.state == NodeState.UP
                          else draining(n.id, held[n.id], n.idle_since) for n in mine
                          if n.state in (NodeState.UP, NodeState.DRAINING))
            launching: dict[int, int] = defaultdict(int)
            for n in mine:
                if n.state == NodeState.LAUNCHING:
                    launching[n.for_job_id or 0] += 1
            closed = self.closed_until.get(p.name, 0.0) > now
            cap = capped(spec.max_nodes or 0, len(mine), closed)
            price, rate = self.price(spec)
            pools.append(replace(p, nodes=nodes, max_nodes=cap, launching=tuple(sorted(launching.items())),
                                 launch_latency_s=spec.launch_latency_s, idle_timeout_s=spec.idle_timeout_s,
                                 price_per_gpu_hour=price, interruption_rate_per_h=rate, closed=closed))
        return replace(snap, pools=tuple(pools))

    def price(self, spec: PoolSpec) -> tuple[float, float]:
        """($/GPU-hour, interruptions per hour) of a pool: its own values, else the catalog's."""
        hit = None
        if not spec.price_per_node_hour or spec.interruption_rate_per_h is None:
            hit = self.catalog.find(spec.provider, spec.region, spec.instance_type or "",
                                    spec.market.value, spec.zone)
        node_h = spec.price_per_node_hour or (hit.usd_per_hour if hit else 0.0)
        rate = spec.interruption_rate_per_h
        if rate is None:
            rate = hit.interruption_rate_per_h if hit else (
                self.catalog_default_rate if spec.market.value == "spot" else 0.0)
        return node_h / spec.gpus_per_node, rate

    @property
    def catalog_default_rate(self) -> float:
        from pricing.catalog import DEFAULT_SPOT_RATE_PER_H

        return DEFAULT_SPOT_RATE_PER_H

    def apply(self, p: Plan, now: float) -> None:
        """Launch plan.launches (one node row each, token first), terminate plan.terminations."""
        for la in p.launches:
            spec = self.pools.get(la.pool)
            if spec is None:
                continue
            for _ in range(la.count):
                nid = f"{la.pool}-{uuid.uuid4().hex[:8]}"
                with self.engine.store.session() as s:
                    s.add(Node(id=nid, pool=la.pool, gpus=spec.gpus_per_node, state=NodeState.LAUNCHING,
                               token=uuid.uuid4().hex, for_job_id=la.for_job_id, launched_at=now))
                    record(s, now, "node_launching", f"renting node {nid} in {la.pool} "
                           f"({spec.instance_type}, {spec.market.value}) for job {la.for_job_id}",
                           job_id=la.for_job_id, pool=la.pool, node=nid, usd_per_hour=la.usd_per_hour)
                if not self._launch_node(nid, now):
                    break
        for nid in p.terminations:
            self._terminate_node(nid, now, "idle")

    def _launch_node(self, node_id: str, now: float) -> bool:
        """Call the provider for a LAUNCHING row (again, after a crash: same token). False if
        the pool refused (NoCapacity/Fatal: the row ends, the pool closes for a while)."""
        with self.engine.store.session() as s:
            n = s.get(Node, node_id)
            assert n is not None and n.token is not None
            spec = self.pools[n.pool]
            req = LaunchRequest(token=n.token, broker_id=self.broker_id, pool=n.pool, node_id=n.id,
                                job_id=n.for_job_id, instance_type=spec.instance_type or "",
                                market=spec.market.value, zone=spec.zone, image=spec.image,
                                user_data=user_data(self.broker_id, n.pool, n.id))
        try:
            inst = self.provider(n.pool).launch(req)
        except Transient as e:
            log.warning("node %s: launch still failing after retries (%s); next cycle retries "
                        "with the same token", node_id, e)
            return True
        except (NoCapacity, Fatal) as e:
            self.closed_until[n.pool] = closed_until(now, fatal=not isinstance(e, NoCapacity))
            with self.engine.store.session() as s:
                row = s.get(Node, node_id)
                assert row is not None
                row.state, row.ended_at = NodeState.TERMINATED, now
                row.end_reason = "no_capacity" if isinstance(e, NoCapacity) else "launch_failed"
                s.add(row)
                record(s, now, row.end_reason, f"{n.pool}: {e}; pool closed to launches for "
                       f"{self.closed_until[n.pool] - now:g}s", job_id=n.for_job_id, pool=n.pool,
                       node=node_id)
            return False
        up = inst.state == InstanceState.RUNNING and spec.launch_latency_s == 0
        self._set(node_id, instance_id=inst.instance_id, zone=inst.zone,
                  **({"state": NodeState.UP, "ready_at": now, "idle_since": now} if up else {}))
        return True

    def _terminate_node(self, node_id: str, now: float, reason: str) -> None:
        with self.engine.store.session() as s:
            n = s.get(Node, node_id)
            if n is None or n.state == NodeState.TERMINATED:
                return
            n.state, n.end_reason = NodeState.TERMINATING, reason
            s.add(n)
        if n.instance_id is not None:
            try:
                self.provider(n.pool).terminate(n.instance_id)
            except ProviderError as e:
                log.warning("node %s: terminate failed (%s); next cycle retries", node_id, e)
                return
        with self.engine.store.session() as s:
            row = s.get(Node, node_id)
            assert row is not None
            row.state, row.ended_at = NodeState.TERMINATED, now
            s.add(row)
            record(s, now, "node_terminated", f"node {node_id} in {row.pool} given back ({reason})",
                   pool=row.pool, node=node_id, reason=reason)

    def _terminate_quietly(self, pool: str, instance_id: str) -> None:
        try:
            self.provider(pool).terminate(instance_id)
        except ProviderError as e:
            log.warning("orphan %s: terminate failed (%s); next reconcile retries", instance_id, e)

    def _set(self, node_id: str, **values: object) -> None:
        with self.engine.store.session() as s:
            n = s.get(Node, node_id)
            assert n is not None
            for k, v in values.items():
                setattr(n, k, v)
            s.add(n)

    def shutdown(self, now: float) -> None:
        """Terminate every rented node this broker holds (tests, `onepool` teardown)."""
        with self.engine.store.session() as s:
            ids = [n.id for n in s.exec(select(Node).where(
                col(Node.pool).in_(list(self.pools)), col(Node.state).in_([*ALIVE, NodeState.TERMINATING])))]
        for nid in ids:
            self._terminate_node(nid, now, "shutdown")


def broker_id(s: Session) -> str:
    """This broker home's id (tags every instance it launches); created once."""
    row = s.get(Setting, "broker_id")
    if row is None:
        row = Setting(key="broker_id", value={"id": f"op-{uuid.uuid4().hex[:12]}"})
        s.add(row)
        s.commit()
    return str(row.value["id"])

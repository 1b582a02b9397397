"""Rented capacity: the engine's hands for plan.launches / plan.terminations, interruption
notices, idle tracking, lost nodes and pools removed from the config. Called from marked
hooks in broker.control.engine (reconcile, and twice per cycle: sync() before the snapshot,
apply() after the plan).

The cycle never calls a cloud API: it writes intents to the database and reads outcomes.
The calls are made by one worker thread per rented pool (broker.control.cloud_worker), so
a slow API stalls only its own pool. `background=False` runs each pool's round inline in
sync() instead (deterministic tests); the logic is the same.

A rented node boots `onepool agent` from its user data (providers.bootstrap), with a join
token derived from its launch token. The node is up when its agent joins (not when the cloud
says the instance runs): ranks placed there run on the instance, through its agent. A node
whose agent has not joined `boot_timeout_s` after its launch (or after the request, while the
cloud has not answered) is given back, and one
whose agent falls silent is terminated, confirmed gone, and only then is its work requeued.

Never twice. A launch first commits a LAUNCHING node row holding a fresh token; the worker
calls provider.launch(token). A broker that dies between the call and writing the instance
id finds the row on restart and calls launch again with the same token: the provider returns
the instance the first call made (ClientToken / request_id / a tag search).

Node lifecycle (broker.state.model.NodeState): launching -> up -> [draining] -> terminating ->
terminated. An interruption notice (recorded before it is acknowledged) drains the node:
its attempts checkpoint now and requeue (Engine.interrupt); once empty it is terminated. A
node the cloud confirms gone is lost: it is terminated and confirmed gone, and only then do
its attempts end LOST and requeue (its work is never placed twice). The nodes of a pool
removed from the config are drained (their attempts checkpoint and requeue elsewhere) and
terminated. Instances tagged by this broker that no live node claims are orphans: swept
at start and every `broker.tasks.sweep_orphans_s` (the leader's sweep_orphans task asks the
workers for it: request_sweeps).

A pool whose provider answered NoCapacity (or Fatal, or raised anything unexpected) is
closed to launches for a back-off (see cloud_worker), and a node under an interruption notice
takes no new work: both rules live in broker.policy.pools (the simulator applies the same
ones), so the next plan falls through to the next-cheapest offer. A pool with no known price
(broker.errors.Unpriced) is closed to launches and says so in its events: it is never free.

Metering (issue 13; broker.state.ledger): every rented node is on the meter from the cloud's
answer to its launch (`ledger.node_up`, in the transaction that writes its instance id) to the cloud's
confirmation of its end (`ledger.node_down`, in the transaction that writes TERMINATED, in
cloud_worker), with `node_ready` (its agent joined) and `node_draining` marking its boot and
drain. The price a pool is metered at is recorded (`ledger.price_changed`) when first seen and
whenever it changes.
"""

from __future__ import annotations

import logging
import signal
import threading
import uuid
from collections import defaultdict
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from sqlalchemy import update
from sqlmodel import Session, col, select

from broker.control.cloud_worker import ALIVE, CloudWorker
from broker.control.config_apply import RENTED_KEY, applied_config
from broker.errors import Unpriced
from broker.policy import NodeView, Plan, Snapshot
from broker.policy.pools import capped, draining
from broker.spec import PoolSpec
from broker.state import ledger
from broker.state.events import record
from broker.state.model import Attempt, AttemptState, Job, Node, NodeState, Notice, Setting
from pricing.catalog import Catalog
from providers.base import Instance, Provider, ProviderError

if TYPE_CHECKING:
    from broker.control.engine import Engine

log = logging.getLogger("onepool.capacity")
HELD = (*ALIVE, NodeState.TERMINATING)  # node states whose instance may still exist


class CapacityManager:
    """One per engine. `providers` may be pre-filled (tests); otherwise built per pool."""

    def __init__(self, engine: Engine, providers: dict[str, Provider] | None = None,
                 catalog: Catalog | None = None, background: bool = True) -> None:
        self.engine = engine
        self.pools: dict[str, PoolSpec] = {p.name: p for p in engine.config.pools if p.rented}
        self.providers: dict[str, Provider] = dict(providers or {})
        self._catalog = catalog
        self.closed_until: dict[str, float] = {}
        self.background = background
        self.workers: dict[str, CloudWorker] = {}
        self.poll_s = engine.settings.cycle_s
        self.orphan_sweep_s = engine.settings.tasks.sweep_orphans_s
        self._lock = threading.Lock()
        self.retired: dict[str, PoolSpec] = {}
        self._zone_ids: dict[str, dict[str, str]] = {}  # pool -> its account's AZ name -> AZ id
        self._unpriced: set[str] = set()  # pools whose missing price was reported
        self._broker_id: str | None = None  # read (created once) when a cloud call first needs it
        self._id_lock = threading.Lock()
        with engine.store.session() as s:
            self._refresh_pools(s)

    @property
    def broker_id(self) -> str:
        """This home's broker id, which tags every instance (created on first use, not when the
        engine is built: an engine built to compute on a snapshot writes nothing)."""
        with self._id_lock:
            if self._broker_id is None:
                with self.engine.store.session() as s:
                    self._broker_id = broker_id(s)
            return self._broker_id

    def _refresh_pools(self, s: Session) -> None:
        """Rented pools as the config applied now says (an `onepool apply` while the broker
        runs takes effect at the next cycle); `retired`: pools applied once, since removed."""
        current = {p.name: p for p in applied_config(s).pools if p.rented}
        row = s.get(Setting, RENTED_KEY)
        known = {k: PoolSpec.model_validate(v) for k, v in (row.value if row else {}).items()}
        with self._lock:
            for name in list(self.providers):
                if name in current and name in self.pools and current[name] != self.pools[name]:
                    del self.providers[name]  # its spec changed: build it again
        self.pools = current
        self.retired = {k: v for k, v in known.items() if k not in current}

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog.snapshot()
        return self._catalog

    def use_catalog(self, catalog: Catalog) -> None:
        """Price from this catalog from now on (a refreshed one: broker.control.prices)."""
        self._catalog = catalog

    def refresh_prices(self, now: float, pricing: Any | None = None) -> list[str]:
        """[issue 12] The scheduled price refresh (broker.control.prices.refresh; `pricing`:
        a Price List API client, default one from the pool's session)."""
        from broker.control import prices

        return prices.refresh(self, now, pricing)

    def spec(self, pool: str) -> PoolSpec:
        return self.pools.get(pool) or self.retired[pool]

    def provider(self, pool: str) -> Provider:
        with self._lock:
            if pool not in self.providers:
                from broker.state.notices import DbNoticeLog
                from providers.registry import make_provider

                notices = DbNoticeLog(self.engine.store, pool, self.engine.clock)
                self.providers[pool] = make_provider(self.spec(pool), notices)
            return self.providers[pool]

    def close_pool(self, pool: str, until: float) -> None:
        self.closed_until[pool] = max(until, self.closed_until.get(pool, 0.0))

    def open_for_launches(self, pool: str, now: float) -> bool:
        return pool in self.pools and self.closed_until.get(pool, 0.0) <= now

    def wake_cycle(self) -> None:
        """A worker changed something the cycle acts on: run the next cycle now."""
        self.engine.wake()

    # -- workers ---------------------------------------------------------------------------------
    def _workers(self) -> list[CloudWorker]:
        """The workers of current rented pools and of removed ones that still hold nodes."""
        with self.engine.store.session() as s:
            holding = set(s.exec(select(Node.pool).where(col(Node.pool).in_(list(self.retired)),
                                                         col(Node.state).in_(HELD))))
        for pool in [*self.pools, *holding]:
            if pool not in self.workers:
                self.workers[pool] = CloudWorker(self, pool)
        return [w for p, w in self.workers.items() if p in self.pools or p in holding]

    def _run_workers(self) -> None:
        needed = self._workers()
        for w in needed:
            if self.background:
                w.start()
                w.wake()
            else:
                w.step()
        for pool, w in list(self.workers.items()):
            if w not in needed:  # a removed pool whose nodes are all gone
                w.stop(timeout=0)
                del self.workers[pool]

    def wake_workers(self) -> None:
        for w in self.workers.values():
            w.wake()

    def request_sweeps(self) -> None:
        """[issue 12] The sweep_orphans task: every pool's worker sweeps at its next round
        (on its own thread; inline in the next sync() when not in the background)."""
        for w in self.workers.values():
            w.request_sweep()

    def close(self) -> None:
        """Stop the background workers."""
        for w in self.workers.values():
            w.stop()

    # -- hook: Engine.reconcile -----------------------------------------------------------------
    def reconcile(self, now: float) -> None:
        """Start the pools' workers: their first round sweeps orphans and adopts launches
        whose answer was never written; lost and half-terminated nodes are finished there."""
        if self.pools or self.retired:
            self._run_workers()

    # -- hook: Engine.cycle, before the snapshot --------------------------------------------------
    def sync(self, now: float) -> None:
        """Act on recorded notices, end the work of nodes confirmed gone, drain the nodes of
        removed pools, track idleness, hand drained nodes to their worker to terminate."""
        with self.engine.store.session() as s:
            self._refresh_pools(s)
        if not self.pools and not self.retired:
            return
        if not self.background:
            self._run_workers()
        self._notices(now)
        self._boot_timeouts(now)
        self._gone_nodes(now)
        self._removed_pools(now)
        self._idle_and_drained(now)
        if self.background:
            self._run_workers()

    def _notices(self, now: float) -> None:
        """Each recorded notice once: drain its node and interrupt the node's attempts.
        Acting on one twice is harmless (a draining node is left as it is)."""
        with self.engine.store.session() as s:
            pending = s.exec(select(Notice).where(col(Notice.handled_at).is_(None)).order_by(Notice.id)
                             .with_for_update(skip_locked=True)).all()
            todo = []
            for it in pending:
                it.handled_at = now
                s.add(it)
                n = s.exec(select(Node).where(Node.instance_id == it.instance_id)).first()
                if n is None or n.state not in (NodeState.UP, NodeState.LAUNCHING):
                    continue
                n.state, n.end_reason = NodeState.DRAINING, "interrupted"
                s.add(n)
                ledger.node_draining(s, n.id, now)  # [issue 13 metering hook]
                record(s, now, "interruption_notice", f"{it.kind} for node {n.id} ({it.instance_id}): "
                       "draining", pool=n.pool, node=n.id, notice=it.kind)
                todo.append((n.id, it.kind))
        for node_id, kind in todo:
            for a in self._open_attempts_on(node_id):
                self.engine.interrupt(a, kind)

    def _gone_nodes(self, now: float) -> None:
        """Open attempts on a TERMINATED node (its instance confirmed gone): their processes
        died with it. Each is stopped (reason "lost", unless a notice had already stopped it)
        and its processes killed; the engine's poll ends it once nothing of it lives: LOST
        (or INTERRUPTED) and requeued, or COMPLETED if every rank had already exited 0."""
        with self.engine.store.session() as s:
            gone = set(s.exec(select(Node.id).where(col(Node.state) == NodeState.TERMINATED,
                                                    col(Node.pool).in_([*self.pools, *self.retired]))))
            ids = [a.id for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED))
                   if any(node in gone for node, _ in a.alloc)]
        for aid in ids:
            with self.engine._contained("stop a lost node's work", aid), self.engine.store.session() as s:
                a = s.get(Attempt, aid)
                if a is None or a.state == AttemptState.ENDED:
                    continue
                if a.state in (AttemptState.LAUNCHING, AttemptState.RUNNING):
                    a.state, a.stop_requested_at, a.stop_reason = AttemptState.STOPPING, now, "lost"
                    a.cause = a.cause or "node_lost"
                    s.add(a)
                    s.commit()
                for h in a.handles:  # the processes would have died with the node
                    self.engine.executor.signal(h, signal.SIGKILL)

    def _removed_pools(self, now: float) -> None:
        """Nodes of pools no longer in the config: drained (attempts checkpoint and requeue
        elsewhere), then terminated by _idle_and_drained."""
        if not self.retired:
            return
        with self.engine.store.session() as s:
            rows = s.exec(select(Node).where(col(Node.pool).in_(list(self.retired)),
                                             col(Node.state).in_([NodeState.LAUNCHING, NodeState.UP]))).all()
            drained = []
            for n in rows:
                n.state, n.end_reason = NodeState.DRAINING, "pool_removed"
                s.add(n)
                ledger.node_draining(s, n.id, now)  # [issue 13 metering hook]
                record(s, now, "pool_removed", f"pool {n.pool} is no longer configured: node {n.id} "
                       "drains and is terminated", pool=n.pool, node=n.id)
                drained.append(n.id)
        for node_id in drained:
            for a in self._open_attempts_on(node_id):
                self.engine.interrupt(a, "pool_removed")

    def _idle_and_drained(self, now: float) -> None:
        with self.engine.store.session() as s:
            busy = {node for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED))
                    for node, _ in a.alloc}
            drained = []
            for n in s.exec(select(Node).where(col(Node.pool).in_([*self.pools, *self.retired]),
                                               col(Node.state).in_([NodeState.UP, NodeState.DRAINING]))):
                if n.state == NodeState.DRAINING and n.id not in busy:
                    drained.append((n.id, n.end_reason or "drained"))
                elif n.id in busy and n.idle_since is not None:
                    n.idle_since = None
                    s.add(n)
                elif n.id not in busy and n.idle_since is None:
                    n.idle_since = now
                    s.add(n)
        for nid, why in drained:
            self.terminate(nid, now, why)

    def _open_attempts_on(self, node_id: str) -> list[int]:
        with self.engine.store.session() as s:
            return [a.id or 0 for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED))
                    if any(node == node_id for node, _ in a.alloc)]

    def launched(self, node_id: str, pool: str, inst: Instance, now: float) -> None:
        """Record a launch's answer (from a worker): the instance id. The node is UP when its
        agent joins (broker.control.agents.join). The node is on the meter from `now` (the
        cloud bills from the launch's answer, not from the intent), booting until it joins;
        if its agent joined before the answer was written, from the join on."""
        with self.engine.store.session() as s:
            n = s.get(Node, node_id)
            if n is None:
                return
            at = now if n.ready_at is None else min(now, n.ready_at)
            res = s.exec(update(Node).where(col(Node.id) == node_id, col(Node.instance_id).is_(None))  # type: ignore[call-overload]
                         .values(instance_id=inst.instance_id, zone=inst.zone, launched_at=at))
            if res.rowcount:
                job = s.get(Job, n.for_job_id) if n.for_job_id is not None else None
                # [issue 13 metering hook] on the meter from the launch's answer on
                ledger.node_up(s, node_id, pool, n.gpus, at, job.team if job is not None else None,
                               rented=True)
                if n.ready_at is not None:
                    ledger.node_ready(s, node_id, n.ready_at)
        self.wake_cycle()

    def agent_lost(self, node_id: str, now: float) -> None:
        """A rented node's agent fell silent: give the instance back. Its work ends (LOST,
        requeued) once the worker confirms the instance gone (_gone_nodes)."""
        self.terminate(node_id, now, "agent_lost")

    def _boot_timeouts(self, now: float) -> None:
        """Launched nodes whose agent has not joined `boot_timeout_s` after the launch
        request are given back."""
        with self.engine.store.session() as s:
            late = [n.id for n in s.exec(select(Node).where(col(Node.pool).in_(list(self.pools)),
                                                            Node.state == NodeState.LAUNCHING))
                    if now - (n.launched_at or now) >= self.pools[n.pool].boot_timeout_s]
        for nid in late:
            self.terminate(nid, now, "agent_never_joined")

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
            try:
                price, rate = self.price(spec)
                self.record_price(spec, price * spec.gpus_per_node, now)
            except Unpriced as e:  # closed to launches, and said so once: never free
                price, rate, cap, closed = 0.0, 0.0, len(mine), True
                self._report_unpriced(spec.name, str(e), now)
            pools.append(replace(p, nodes=nodes, max_nodes=cap, launching=tuple(sorted(launching.items())),
                                 launch_latency_s=spec.launch_latency_s, idle_timeout_s=spec.idle_timeout_s,
                                 price_per_gpu_hour=price, interruption_rate_per_h=rate, closed=closed))
        return replace(snap, pools=tuple(pools))

    def price(self, spec: PoolSpec) -> tuple[float, float]:
        """($/GPU-hour, interruptions per hour) of a pool: its own values, else the catalog's.
        Raises Unpriced when neither gives a price."""
        zone_ids = self.zone_ids(spec) if (not spec.price_per_node_hour
                                           or spec.interruption_rate_per_h is None) else None
        node_h = ledger.list_price(spec, self.catalog, zone_ids)
        rate = spec.interruption_rate_per_h
        if rate is None:
            try:
                rate = ledger.catalog_offer(spec, self.catalog, zone_ids).interruption_rate_per_h
            except Unpriced:  # priced by the config only: the default reclaim rate for spot
                rate = self.catalog_default_rate if spec.market.value == "spot" else 0.0
        return node_h / spec.gpus_per_node, rate

    def zone_ids(self, spec: PoolSpec) -> dict[str, str] | None:
        """The account's AZ name -> AZ id mapping for a pool naming a zone, when its provider
        has one (AWS: describe_availability_zones); asked once per pool. None otherwise."""
        if not spec.zone:
            return None
        if spec.name not in self._zone_ids:
            ask = getattr(self.provider(spec.name), "zone_ids", None)
            try:
                self._zone_ids[spec.name] = ask() if ask is not None else {}
            except ProviderError as e:
                log.warning("pool %s: cannot map zone names to ids now (%s)", spec.name, e)
                return None
        return self._zone_ids[spec.name]

    def record_price(self, spec: PoolSpec, usd_per_node_hour: float, now: float) -> None:
        """[issue 13 metering hook] Record the pool's price when first seen and on every change."""
        with self.engine.store.session() as s:
            if ledger.recorded_price(s, spec.name) != usd_per_node_hour:
                ledger.price_changed(s, spec.name, usd_per_node_hour, now)

    def _report_unpriced(self, pool: str, why: str, now: float) -> None:
        if pool in self._unpriced:
            return
        self._unpriced.add(pool)
        log.error("%s; the pool is closed to launches", why)
        with self.engine.store.session() as s:
            record(s, now, "pool_unpriced", f"{why}; closed to launches until it has a price",
                   pool=pool)

    @property
    def catalog_default_rate(self) -> float:
        from pricing.catalog import DEFAULT_SPOT_RATE_PER_H

        return DEFAULT_SPOT_RATE_PER_H

    def apply(self, p: Plan, now: float) -> None:
        """Write intents: a LAUNCHING row (token first) per plan.launches node, TERMINATING
        for plan.terminations; the pools' workers make the calls."""
        for la in p.launches:
            spec = self.pools.get(la.pool)
            if spec is None or not self.open_for_launches(la.pool, now):
                continue
            for _ in range(la.count):
                nid = f"{la.pool}-{uuid.uuid4().hex[:8]}"
                with self.engine.store.session() as s:
                    s.add(Node(id=nid, pool=la.pool, gpus=spec.gpus_per_node, state=NodeState.LAUNCHING,
                               token=uuid.uuid4().hex, for_job_id=la.for_job_id, launched_at=now))
                    record(s, now, "node_launching", f"renting node {nid} in {la.pool} "
                           f"({spec.instance_type}, {spec.market.value}) for job {la.for_job_id}",
                           job_id=la.for_job_id, pool=la.pool, node=nid, usd_per_hour=la.usd_per_hour)
        for nid in p.terminations:
            self.terminate(nid, now, "idle")
        if (p.launches or p.terminations) and self.background:
            self._run_workers()

    def terminate(self, node_id: str, now: float, reason: str) -> None:
        """Decide to give a node back (UP/DRAINING/LAUNCHING -> TERMINATING); its worker
        terminates it and confirms it gone."""
        with self.engine.store.session() as s:
            res = s.exec(update(Node).where(col(Node.id) == node_id, col(Node.state).in_(list(ALIVE)))  # type: ignore[call-overload]
                         .values(state=NodeState.TERMINATING, end_reason=reason))
            pool = s.exec(select(Node.pool).where(Node.id == node_id)).first()
            if res.rowcount:
                ledger.node_draining(s, node_id, now)  # [issue 13 metering hook] until confirmed gone
                record(s, now, "node_releasing", f"giving node {node_id} in {pool} back ({reason})",
                       pool=pool, node=node_id, reason=reason)
        w = self.workers.get(pool or "")
        if res.rowcount and w is not None:
            w.wake()

    def shutdown(self, now: float) -> None:
        """Decide to terminate every rented node this broker holds (the workers do it)."""
        with self.engine.store.session() as s:
            ids = [n.id for n in s.exec(select(Node).where(
                col(Node.pool).in_([*self.pools, *self.retired]), col(Node.state).in_(list(ALIVE))))]
        for nid in ids:
            self.terminate(nid, now, "shutdown")


def broker_id(s: Session) -> str:
    """This broker home's id (tags every instance it launches); created once."""
    row = s.get(Setting, "broker_id")
    if row is None:
        row = Setting(key="broker_id", value={"id": f"op-{uuid.uuid4().hex[:12]}"})
        s.add(row)
        s.commit()
    return str(row.value["id"])

"""The cloud's slow hands, off the scheduling cycle: one worker thread per rented pool.

The cycle (broker.control.capacity_manager) only writes intents to the database (a LAUNCHING
node row holding its token, a TERMINATING row) and reads outcomes; it never waits on a
cloud API. Each pool's worker makes that pool's provider calls, every `cycle_s` or at once
when woken, so a slow or throttled API (listing, the SQS drain, GCP operation waits,
retries with backoff) stalls only its own pool:

1. list the pool's instances (the listing is kept with the time it was taken);
2. read interruption notices, RECORD them (Notice rows, one per key), then ack() them:
   a broker that dies in between gets them again, and records them once;
3. launch LAUNCHING rows without an instance (same token after a crash: never twice);
   NoCapacity / Fatal / an unexpected error end the row and close the pool for a while;
4. terminate TERMINATING rows and confirm each instance gone (describe() by id) before the
   row becomes TERMINATED; only then does the cycle end the node's attempts and requeue;
5. a node missing from a listing is looked up by id: lost only if the cloud confirms it
   (a listing that missed a live instance changes nothing); a lost node is terminated and
   confirmed gone like any other (step 4);
6. at start, when asked (request_sweep: the leader's sweep_orphans task) and, while no
   schedule drives the engine's duties, every `orphan_sweep_s`: instances tagged with this
   broker that no live node row claims are terminated; one whose launch answer was never
   written is adopted. A requested sweep waits for a round whose listing succeeded.

State changes are conditional UPDATEs (they apply only if the row is still in the state
the worker saw), so the worker and the cycle never overwrite each other. All writes go
through the engine's fenced store: a worker of a broker that lost the lease stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlmodel import Session, col, select

from broker.control.guards import BROKER_FAILURES
from broker.crashpoints import crash_point
from broker.errors import LeaseLost, NotLeader
from broker.policy.pools import closed_until
from broker.state import ledger
from broker.state.events import record
from broker.state.model import Node, NodeState, Notice
from broker.state.tokens import derived_join_token
from providers.base import (
    TAG_POOL,
    Fatal,
    Instance,
    InstanceState,
    Interruption,
    LaunchRequest,
    NoCapacity,
    ProviderError,
    Transient,
)
from providers.bootstrap import Boot, user_data

if TYPE_CHECKING:
    from broker.control.capacity_manager import CapacityManager

log = logging.getLogger("onepool.cloud")
T = TypeVar("T")
UNEXPECTED_BACKOFF_S = 600.0  # a provider raised something outside its contract
LOST_GRACE_S = 120.0  # a launching instance missing from the listing this long is lost
ALIVE = (NodeState.LAUNCHING, NodeState.UP, NodeState.DRAINING)


@dataclass(frozen=True)
class Listing:
    taken_at: float  # the clock before the call: anything launched later may be missing
    instances: dict[str, Instance]


class CloudWorker:
    """The provider calls of one pool. `step()` is one round; `start()` runs rounds in a
    daemon thread until `stop()`."""

    def __init__(self, cm: CapacityManager, pool: str) -> None:
        self.cm, self.pool = cm, pool
        self.listing: Listing | None = None
        self.swept_at: float | None = None
        self._sweep_requested = threading.Event()  # request_sweep(): sweep at the next round
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the thread --------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"cloud-{self.pool}", daemon=True)
            self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def request_sweep(self) -> None:
        """Sweep orphans at the next round whose listing succeeds (from any thread)."""
        self._sweep_requested.set()
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except (LeaseLost, NotLeader) as e:
                log.warning("pool %s: %s; its cloud worker stops", self.pool, e)
                return
            except OperationalError as e:
                log.warning("pool %s: database unavailable (%s); next round retries", self.pool, e)
            except Exception:  # a bug: logged with its traceback; the next round tries again
                log.exception("pool %s: cloud round failed", self.pool)
            self._wake.wait(self.cm.poll_s)
            self._wake.clear()

    # -- one round -----------------------------------------------------------------------------
    def step(self) -> None:
        """List, record and ack notices, launch, terminate (confirmed), find lost nodes,
        sweep orphans when due. Provider failures are contained (see _call)."""
        eng = self.cm.engine
        eng.store.ensure()
        now = eng.clock.now()
        before = {n.id: n.instance_id for n in self._rows(ALIVE)}
        seen = self._call("list instances", lambda: self.cm.provider(self.pool).poll(self.cm.broker_id))
        if seen is not None:
            self.listing = Listing(now, {i.instance_id: i for i in seen
                                         if i.tags.get(TAG_POOL) in (self.pool, None)})
        notices = self._call("read interruption notices", lambda: self.cm.provider(self.pool).interruptions())
        if notices:
            self._record(notices, now)
            crash_point("notice")  # recorded, not acknowledged
            self._call("acknowledge notices", lambda: self.cm.provider(self.pool).ack(notices))
        for n in self._rows((NodeState.LAUNCHING,)):
            if n.instance_id is None:
                if not self.cm.open_for_launches(self.pool, now):
                    self._refused_all(now, "the pool is closed to launches after a refusal")
                    break
                eng.store.ensure()
                self._launch(n.id, now)
        for n in self._rows((NodeState.TERMINATING,)):
            eng.store.ensure()
            self._terminate(n.id, n.instance_id, n.end_reason or "terminated", eng.clock.now())
        if seen is not None and self.listing is not None:
            self._reconcile_listing(before, now)
            timed = (not self.cm.engine.duties_scheduled
                     and now - (self.swept_at or now) >= self.cm.orphan_sweep_s)
            if self.swept_at is None or self._sweep_requested.is_set() or timed:
                self._sweep_requested.clear()
                self._sweep(now)
                self.swept_at = now

    def _call(self, what: str, fn: Callable[[], T]) -> T | None:
        """A provider call whose failure is contained: Transient (retries ran out) and the
        other ProviderErrors are logged and retried next round; anything else closes the
        pool to launches for UNEXPECTED_BACKOFF_S. None on failure."""
        try:
            return fn()
        except BROKER_FAILURES:
            raise
        except ProviderError as e:
            log.warning("pool %s: cannot %s now (%s); next round retries", self.pool, what, e)
        except Exception as e:  # noqa: BLE001  (logged with its traceback; the pool closes for a while)
            self._unexpected(what, e)
        return None

    def _unexpected(self, what: str, e: Exception) -> None:
        log.error("pool %s: the provider raised %s during %s", self.pool, type(e).__name__, what,
                  exc_info=e)
        now = self.cm.engine.clock.now()
        self.cm.close_pool(self.pool, now + UNEXPECTED_BACKOFF_S)
        with self.cm.engine.store.session() as s:
            record(s, now, "provider_error", f"{self.pool}: {what} raised {type(e).__name__}: {e}; "
                   f"pool closed to launches for {UNEXPECTED_BACKOFF_S:g}s", pool=self.pool)

    def _rows(self, states: tuple[str, ...]) -> list[Node]:
        with self.cm.engine.store.session() as s:
            return list(s.exec(select(Node).where(Node.pool == self.pool, col(Node.state).in_(states))
                               .order_by(Node.id)).all())

    def _transition(self, node_id: str, states: tuple[str, ...], *,
                    meter: Callable[[Session], None] | None = None, **values: Any) -> bool:
        """Set `values` on the node if it is still in one of `states`, and in the same
        transaction run `meter` (the ledger's hook for that change). True if it was."""
        with self.cm.engine.store.session() as s:
            res = s.exec(update(Node).where(col(Node.id) == node_id, col(Node.state).in_(states))  # type: ignore[call-overload]
                         .values(**values))
            if res.rowcount and meter is not None:
                meter(s)
            return bool(res.rowcount)

    @staticmethod
    def _draining(node_id: str, now: float) -> Callable[[Session], None]:
        """[issue 13 metering hook] the node drains until its end is confirmed."""
        return lambda s: ledger.node_draining(s, node_id, now)

    def _down(self, node_id: str, now: float) -> Callable[[Session], None]:
        """[issue 13 metering hook] the node's meter stops: its end is confirmed."""
        return lambda s: ledger.node_down(s, node_id, now, self.cm.engine.config)

    # -- notices -------------------------------------------------------------------------------
    def _record(self, notices: list[Interruption], now: float) -> None:
        """Record each notice once (by its key), before it is acknowledged."""
        for it in notices:
            try:
                with self.cm.engine.store.session() as s:
                    if s.exec(select(Notice.id).where(Notice.key == it.identity[:255])).first() is None:
                        s.add(Notice(key=it.identity[:255], pool=self.pool, instance_id=it.instance_id,
                                     kind=it.kind[:32], deadline=it.deadline, received_at=now))
            except IntegrityError:  # recorded meanwhile (two pools reading one queue)
                continue
        self.cm.wake_cycle()

    # -- launch --------------------------------------------------------------------------------
    def _launch(self, node_id: str, now: float) -> None:
        with self.cm.engine.store.session() as s:
            n = s.get(Node, node_id)
            if n is None or n.state != NodeState.LAUNCHING or n.instance_id is not None or n.token is None:
                return
            spec = self.cm.spec(n.pool)
            settings = self.cm.engine.settings
            join = derived_join_token(s, n.id, n.token, now, spec.boot_timeout_s + spec.launch_latency_s)
            boot = Boot(server_url=settings.server_url or "", join_token=join, node_id=n.id,
                        pool=n.pool, provider=spec.provider, gpus=spec.gpus_per_node,
                        gpu_type=spec.gpu_type, agent_package=settings.agent_package,
                        metadata=spec.provider if spec.provider in ("aws", "gcp") else "none",
                        prepull_images=tuple(spec.prepull_images),
                        container_runtime=spec.container_runtime.value if spec.container_runtime else None)
            req = LaunchRequest(token=n.token, broker_id=self.cm.broker_id, pool=n.pool, node_id=n.id,
                                job_id=n.for_job_id, instance_type=spec.instance_type or "",
                                market=spec.market.value, zone=spec.zone, image=spec.image,
                                user_data=user_data(boot))
            job_id = n.for_job_id
        try:
            inst = self.cm.provider(self.pool).launch(req)
        except BROKER_FAILURES:
            raise
        except Transient as e:
            log.warning("node %s: launch still failing after retries (%s); next round retries "
                        "with the same token", node_id, e)
            return
        except (NoCapacity, Fatal) as e:
            backoff = closed_until(now, fatal=not isinstance(e, NoCapacity)) - now
            why = "no_capacity" if isinstance(e, NoCapacity) else "launch_failed"
            self._refused(node_id, job_id, now, backoff, why, f"{e}")
            return
        except Exception as e:  # outside the contract: the instance may exist (the sweep ends it)
            log.error("pool %s: launch of %s raised %s", self.pool, node_id, type(e).__name__, exc_info=e)
            self._refused(node_id, job_id, now, UNEXPECTED_BACKOFF_S, "launch_failed",
                          f"the provider raised {type(e).__name__}: {e}")
            return
        crash_point("cloud_launch")  # launched, the answer not written yet
        self.cm.launched(node_id, self.pool, inst, self.cm.engine.clock.now())

    def _refused(self, node_id: str, job_id: int | None, now: float, backoff: float, why: str,
                 msg: str) -> None:
        self.cm.close_pool(self.pool, now + backoff)
        self._end_launch(node_id, job_id, now, why, f"{self.pool}: {msg}; pool closed to launches "
                         f"for {backoff:g}s")
        self._refused_all(now, f"the pool is closed to launches for {backoff:g}s")

    def _refused_all(self, now: float, msg: str) -> None:
        """End every LAUNCHING row of the closed pool that was never sent (the plan then
        looks at the next pool)."""
        for n in self._rows((NodeState.LAUNCHING,)):
            if n.instance_id is None:
                self._end_launch(n.id, n.for_job_id, now, "no_capacity", f"{self.pool}: {msg}")

    def _end_launch(self, node_id: str, job_id: int | None, now: float, why: str, msg: str) -> None:
        if self._transition(node_id, (NodeState.LAUNCHING,), state=NodeState.TERMINATED, ended_at=now,
                            end_reason=why, meter=self._down(node_id, now)):
            with self.cm.engine.store.session() as s:
                record(s, now, why, msg, job_id=job_id, pool=self.pool, node=node_id)
            self.cm.wake_cycle()

    # -- terminate, confirmed ------------------------------------------------------------------
    def _terminate(self, node_id: str, instance_id: str | None, reason: str, now: float) -> None:
        """Terminate the node's instance and confirm it gone; then the row is TERMINATED.
        Until confirmed it stays TERMINATING (its work is not placed again)."""
        if instance_id is not None:
            prov = self.cm.provider(self.pool)
            if self._call(f"terminate {instance_id}", lambda: prov.terminate(instance_id) or True) is None:
                return
            left = self._call(f"confirm {instance_id} gone", lambda: [prov.describe(instance_id)])
            if left is None or left[0] is not None:
                return  # not confirmed yet: the next round terminates and looks again
        if self._transition(node_id, (NodeState.TERMINATING,), state=NodeState.TERMINATED, ended_at=now,
                            meter=self._down(node_id, now)):
            with self.cm.engine.store.session() as s:
                record(s, now, "node_terminated", f"node {node_id} in {self.pool} given back ({reason}); "
                       "its instance is confirmed gone", pool=self.pool, node=node_id, reason=reason)
            self.cm.wake_cycle()

    # -- the listing: ready, lost, orphans -----------------------------------------------------
    def _reconcile_listing(self, before: dict[str, str | None], now: float) -> None:
        assert self.listing is not None
        live = self.listing.instances
        for n in self._rows(ALIVE):
            iid = n.instance_id
            if iid is None:
                continue
            if iid in live:
                continue  # running: it is UP once its agent joins (broker.control.agents.join)
            if before.get(n.id) != iid:
                continue  # its instance was recorded after the listing was taken
            if n.state == NodeState.LAUNCHING and now - (n.launched_at or now) < LOST_GRACE_S:
                continue  # a fresh launch may not be listed yet
            found = self._call(f"look up {iid}", lambda i=iid: [self.cm.provider(self.pool).describe(i)])
            if found is None or (found[0] is not None and found[0].state != InstanceState.GONE):
                continue  # the listing missed a live instance (or the lookup failed): not lost
            if self._transition(n.id, ALIVE, state=NodeState.TERMINATING, end_reason="lost",
                                meter=self._draining(n.id, now)):
                with self.cm.engine.store.session() as s:
                    record(s, now, "node_lost", f"node {n.id} ({iid}) is gone from {self.pool}: "
                           "its work is requeued once the instance is confirmed gone", pool=self.pool,
                           node=n.id, instance_id=iid)
                self._terminate(n.id, iid, "lost", now)

    def _sweep(self, now: float) -> None:
        """Terminate listed instances no live node row claims; adopt a launch whose answer
        was never written."""
        assert self.listing is not None
        with self.cm.engine.store.session() as s:
            nodes = {n.id: n for n in s.exec(select(Node).where(Node.pool == self.pool))}
        for inst in self.listing.instances.values():
            n = nodes.get(inst.node_id or "")
            if n is not None and n.state in (*ALIVE, NodeState.TERMINATING):
                if n.instance_id is None:  # launched, but the answer was never written
                    self.cm.launched(n.id, self.pool, inst, now)
                    continue
                if n.instance_id == inst.instance_id:
                    continue
            if self._call(f"terminate orphan {inst.instance_id}",
                          lambda i=inst.instance_id: self.cm.provider(self.pool).terminate(i) or True):
                with self.cm.engine.store.session() as s:
                    record(s, now, "orphan_terminated", f"instance {inst.instance_id} in {self.pool} "
                           f"(node {inst.node_id}) is not known alive to this broker: terminated",
                           pool=self.pool, instance_id=inst.instance_id, node=inst.node_id)

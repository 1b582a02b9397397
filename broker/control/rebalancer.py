"""Rebalancing in the live broker: the engine's hands for broker.policy.rebalance / .defrag.

A move never kills work. Its phases, one step per cycle (`advance`, before the snapshot):

    launching      (B rents nodes for it)  B's nodes launched for the job are up -> checkpointing
    checkpointing  SIGUSR1 sent ("checkpoint now, keep running"); once a checkpoint newer
                   than the request is committed -> SIGTERM, stop reason "rebalanced"
    stopping       the attempt exits (it saved on the signal too) and ends REBALANCED; the job
                   is placed at once on the GPUs held for it in B -> placed
    placed         when its attempt in B ends, the realized saving is recorded; done.

While a move is in flight its target GPUs are held (`hold`: the plan sees them as taken by a
stopping attempt) and its job is kept out of the plan once it requeues, so nothing else
lands on them and the job goes to B, not back to A. A checkpoint not committed within
`rebalance.checkpoint_wait_s`, nodes that never come up, or target GPUs gone by the time
the job stops: the move is given up (the job keeps running, or is placed by the plan as
usual) and says so in its event.

In-flight moves live in the database (Setting "rebalance_moves"), so a new leader carries
them on. Events: rebalance_move (decided: expected saving and cost, reason),
rebalance_moved (placed in B), rebalance_realized (its attempt in B ended: realized saving),
rebalance_abandoned.

Realized saving of a move = its realized gross saving - (GPUs x A's price x the stop's drain
time + GPUs x (B's price + gpu_hour_value) x its measured restart overhead + the egress it
paid). The gross saving comes from the ledger (`realized_gross`): A's USD per GPU-hour as
decided (interruption risk included) x the GPU-hours the ledger charged the attempt in B,
minus what they cost there, minus, when A rents its nodes, what the ledger charged for
A's node(s) standing unused (idle, drain) from the move until the attempt in B ended: a
rented node is billed whole, so GPUs a move frees save nothing until the node is given back.
Onto capacity that does not rent, the saving counts only until another job that could have
used those GPUs started on rented capacity (`displaced_at`): from then on the move shifted
rented work from one job to another, and saved nothing more.
Without ledger rows for B (never charged) it is (A's - B's price as decided) x GPUs x hours
it ran in B. For a defragmenting move the gross saving is its share of the gang's avoided
wait if the gang started before the moved attempt ended, else 0.

Each round's decisions are corrected by what past moves realized
(broker.control.rebalance_history.corrected, broker.policy.rebalance_realized).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from broker.checkpoint import index as ckpt_index
from broker.control.rebalance_history import corrected
from broker.policy import Placement, RunningView, Snapshot, plan
from broker.policy.defrag import defrag
from broker.policy.rebalance import AttemptFacts, Move, RebalanceConfig, rebalance
from broker.spec import Priority, RebalanceSettings, SpotPolicy
from broker.state.events import record
from broker.state.model import (
    Attempt,
    AttemptState,
    Checkpoint,
    Job,
    JobState,
    LedgerEntry,
    Node,
    NodeState,
    Setting,
)
from pricing.egress import egress_usd

if TYPE_CHECKING:
    from broker.control.engine import CycleReport, Engine

log = logging.getLogger("onepool.rebalance")
KEY = "rebalance_moves"


def config_of(rs: RebalanceSettings) -> RebalanceConfig:
    """The policy's RebalanceConfig from onepool.yaml's broker.rebalance."""
    return RebalanceConfig(min_saving_usd=rs.min_saving_usd, max_moves=rs.max_moves,
                           defrag_after_s=rs.defrag_after_s)


def load(s: Session) -> list[dict[str, Any]]:
    row = s.get(Setting, KEY)
    return list(row.value.get("moves", [])) if row else []


def save(s: Session, moves: list[dict[str, Any]]) -> None:
    row = s.get(Setting, KEY) or Setting(key=KEY, value={})
    row.value = {"moves": moves}
    s.add(row)


def realized_gross(s: Session, rec: dict[str, Any], b: Attempt, rented: frozenset[str],
                   to_type: str = "") -> float | None:
    """A finished move's gross saving from the ledger (see the module docstring); None when
    the ledger charged nothing for its attempt in B. `rented`: the pools that rent nodes;
    `to_type`: B's GPU type."""
    rows = s.exec(select(LedgerEntry).where(LedgerEntry.attempt_id == b.id, LedgerEntry.kind == "gpu")).all()
    if not rows:
        return None
    start, end = rec.get("moved_at", b.started_at), b.ended_at or max(r.end for r in rows)
    if rec["to_pool"] not in rented:  # on capacity that does not rent: until the queue needed it
        end = min(end, displaced_at(s, b, rented, to_type, start, end))
    gpu_h = usd = 0.0
    for r in rows:
        part = max(0.0, min(r.end, end) - r.start) / (r.end - r.start) if r.end > r.start else 0.0
        gpu_h += r.gpus * (r.end - r.start) * part / 3600.0
        usd += r.usd * part
    gross = rec["usd_per_gpu_hour_from"] * gpu_h - usd
    if rec["from_pool"] in rented and rec.get("from_nodes"):
        unused = s.exec(select(LedgerEntry).where(col(LedgerEntry.node).in_(rec["from_nodes"]),
                                                  col(LedgerEntry.kind).in_(("idle", "drain")),
                                                  LedgerEntry.end > start, LedgerEntry.start < end)).all()
        gross -= min(sum(r.usd for r in unused), rec["usd_per_gpu_hour_from"] * gpu_h)
    return gross


def displaced_at(s: Session, b: Attempt, rented: frozenset[str], to_type: str, start: float,
                 end: float) -> float:
    """When, after `start` and before `end`, another job started on rented capacity that could
    have run on the GPUs the moved attempt `b` held (no more GPUs, B's type acceptable): from
    then on the move only shifted rented work from one job to another. `end` if none did."""
    if not rented:
        return end
    q = (select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
         .where(col(Attempt.pool).in_(rented), Attempt.started_at > start, Attempt.started_at < end,
                Attempt.job_id != b.job_id, Attempt.gpus <= b.gpus)
         .order_by(col(Attempt.started_at)))
    for a, j in s.exec(q):
        if not j.gpu_types or to_type in j.gpu_types:
            return a.started_at
    return end


def attempt_facts(s: Session, snap: Snapshot, engine_config: Any, home: Any) -> dict[int, AttemptFacts]:
    """AttemptFacts of every running attempt: its pool, the job's spot policy and GPU types,
    its expected remaining run time (the job's own progress rate, else its expected duration
    less this attempt's run time; None: unknown) and the egress of its newest checkpoint to
    every other pool's store."""
    ids = [r.attempt_id for r in snap.running if r.attempt_id > 0]
    if not ids:
        return {}
    rows = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
                  .where(col(Attempt.id).in_(ids))).all()
    roots = {p.name: ckpt_index.pool_store_root(engine_config, p.name, home)
             for p in engine_config.pools}
    out = {}
    for a, j in rows:
        newest = s.exec(select(Checkpoint).where(Checkpoint.job_id == j.id,
                                                 col(Checkpoint.deleted_at).is_(None))
                        .order_by(col(Checkpoint.step).desc())).first()
        nbytes = newest.bytes if newest is not None else a.restore_bytes
        src = roots.get(a.pool, "")
        egress = tuple((p, egress_usd(nbytes, ckpt_index.locate(engine_config, src),
                                      ckpt_index.locate(engine_config, root)))
                       for p, root in sorted(roots.items()) if root != src and nbytes)
        out[a.id or 0] = AttemptFacts(a.pool, SpotPolicy(j.spot), tuple(j.gpu_types),
                                      _remaining(a, j, snap.now), j.checkpoint_interval_s, egress)
    return out


def _remaining(a: Attempt, j: Job, now: float) -> float | None:
    if a.progress_total and a.progress_step is not None and a.progress_rate:
        return max(0.0, (a.progress_total - a.progress_step) / a.progress_rate)
    if j.expected_duration_s:
        return max(0.0, j.expected_duration_s - (now - a.started_at))
    return None


class Rebalancer:
    """One per engine. `decide` is the scheduled task; `advance` and `hold` are cycle hooks."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @property
    def settings(self) -> RebalanceSettings:
        return self.engine.settings.rebalance

    # -- deciding (the scheduled task, and `onepool rebalance --dry-run`) ----------------------
    def proposals(self, now: float) -> tuple[Move, ...]:
        """The moves rebalancing would start now (nothing is changed)."""
        e = self.engine
        with e.store.session() as s:
            busy = frozenset(m["job_id"] for m in load(s))
            snap = e.snapshot(s, now)
            p = plan(snap)
            facts = attempt_facts(s, snap, e.config, e.store.home)
            rc = corrected(s, config_of(self.settings))
        moves = list(rebalance(snap, p, facts, rc, busy))
        held = {nd for m in moves for nd, _ in m.alloc}
        moving = {m.job_id for m in moves}
        for m in defrag(snap, p, facts, rc, busy | moving):
            if not held & {nd for nd, _ in m.alloc}:
                moves.append(m)
        return tuple(moves)

    def decide(self, now: float) -> list[Move]:
        """Start the moves that pay now (the scheduled `rebalance` task)."""
        moves = list(self.proposals(now))
        for m in moves:
            self._start(m, now)
        return moves

    def _start(self, m: Move, now: float) -> None:
        e = self.engine
        with e.store.session() as s:
            a = s.get(Attempt, m.attempt_id)
            if a is None or a.state != AttemptState.RUNNING:
                return
            rec = {**asdict(m), "alloc": [list(x) for x in m.alloc], "phase": "launching"
                   if m.launch else "checkpointing", "since": now, "requested_at": None}
            record(s, now, "rebalance_move", f"moving from {m.from_pool} to {m.to_pool} ({m.reason}): "
                   f"expected saving ${m.saving_usd:.2f} for a move costing ${m.cost_usd:.2f}; "
                   "checkpoint now, then stop and resume there", job_id=m.job_id, attempt_id=m.attempt_id,
                   **m.as_dict())
            save(s, [*load(s), rec])
            s.commit()
        if m.launch:
            from broker.policy import Launch, Plan

            e.capacity.apply(Plan(launches=(Launch(m.to_pool, m.launch, m.job_id,
                                                   m.usd_per_gpu_hour_to * m.launch),),), now)
        else:
            self._checkpoint(m.attempt_id, m.job_id, now)

    def _checkpoint(self, attempt_id: int, job_id: int, now: float) -> None:
        with self.engine.store.session() as s:
            moves = load(s)
            for rec in moves:
                if rec["job_id"] == job_id:
                    rec["phase"], rec["requested_at"], rec["since"] = "checkpointing", now, now
            save(s, moves)
            s.commit()
        self.engine.request_checkpoint(attempt_id, "rebalance: moving to cheaper capacity")

    # -- cycle hook: before the snapshot --------------------------------------------------------
    def advance(self, now: float, rep: CycleReport) -> None:
        """Take every in-flight move one phase further (see the module docstring)."""
        e = self.engine
        with e.store.session() as s:
            moves = load(s)
        if not moves:
            return
        keep: list[dict[str, Any]] = []
        for rec in moves:
            with e._contained("rebalance", rec["attempt_id"]):
                if self._step(rec, now, rep):
                    keep.append(rec)
                continue
            keep.append(rec)  # contained failure: try again next cycle
        with e.store.session() as s:
            save(s, keep)
            s.commit()

    def _step(self, rec: dict[str, Any], now: float, rep: CycleReport) -> bool:
        """One phase step; False when the move is finished or given up."""
        e, phase = self.engine, rec["phase"]
        with e.store.session() as s:
            a = s.get(Attempt, rec["attempt_id"])
            if a is None:
                return False
            if phase == "launching":
                return self._launched(s, rec, a, now)
            if phase == "checkpointing":
                if a.state != AttemptState.RUNNING:
                    return self._give_up(s, rec, now, f"attempt {a.number} stopped before its checkpoint")
                if a.last_checkpoint_at is not None and a.last_checkpoint_at >= rec["requested_at"]:
                    record(s, now, "rebalance_stopping", f"checkpoint at step {a.reached_step} committed; "
                           f"stopping to resume in {rec['to_pool']}", job_id=a.job_id, attempt_id=a.id)
                    rec["phase"], rec["since"] = "stopping", now
                    e._request_stop(s, a, now, "rebalanced")
                    return True
                if now - rec["requested_at"] >= self.settings.checkpoint_wait_s:
                    return self._give_up(s, rec, now, f"no checkpoint committed within "
                                         f"{self.settings.checkpoint_wait_s:g}s of the request")
                return True
            if phase == "stopping":
                if a.state != AttemptState.ENDED:
                    return True
                job = s.get(Job, a.job_id)
                if a.end_reason != "REBALANCED" or job is None or job.state != JobState.PENDING:
                    return self._give_up(s, rec, now, f"attempt ended {a.end_reason}, not by the move")
                alloc = [(nd, g) for nd, g in rec["alloc"]]
                if not self._still_free(s, alloc):
                    return self._give_up(s, rec, now, f"the GPUs held in {rec['to_pool']} are gone; "
                                         "the job waits in the queue as usual")
                rec["drain_s"] = (a.ended_at or now) - (a.stop_requested_at or now)
                rec["moved_at"], rec["from_nodes"] = a.ended_at or now, [nd for nd, _ in a.alloc]
                pl = Placement(a.job_id, rec["to_pool"], tuple(alloc), Priority(a.priority))
            elif phase == "placed":
                return self._placed(s, rec, now)
            else:
                return False
        e._launch(pl, now, rep)  # outside the session: it opens its own
        with e.store.session() as s:
            b = s.exec(select(Attempt).where(Attempt.job_id == rec["job_id"])
                       .order_by(col(Attempt.number).desc())).first()
            if b is None or b.id == rec["attempt_id"] or b.state == AttemptState.ENDED:
                return self._give_up(s, rec, now, "the placement in the target pool failed")
            rec["phase"], rec["since"], rec["new_attempt_id"] = "placed", now, b.id
            record(s, now, "rebalance_moved", f"resumed in {rec['to_pool']} (from {rec['from_pool']}): "
                   f"expected saving ${rec['saving_usd']:.2f}, cost ${rec['cost_usd']:.2f}",
                   job_id=b.job_id, attempt_id=b.id, from_pool=rec["from_pool"], to_pool=rec["to_pool"],
                   expected_saving_usd=rec["saving_usd"], expected_cost_usd=rec["cost_usd"],
                   reason=rec["reason"])
        return True

    def _launched(self, s: Session, rec: dict[str, Any], a: Attempt, now: float) -> bool:
        if a.state != AttemptState.RUNNING:
            return self._give_up(s, rec, now, "the attempt stopped while nodes were launching for it")
        nodes = s.exec(select(Node).where(Node.pool == rec["to_pool"],
                                          Node.for_job_id == rec["job_id"])).all()
        gpn = len(a.alloc[0][1])
        up = [n for n in nodes if n.state == NodeState.UP and self._still_free(s, [(n.id, gpn)])]
        if len(up) >= rec["launch"]:
            rec["alloc"] = [[n.id, gpn] for n in sorted(up, key=lambda n: n.id)[: rec["launch"]]]
            rec["phase"], rec["requested_at"], rec["since"] = "checkpointing", now, now
            s.commit()
            self.engine.request_checkpoint(a.id or 0, "rebalance: moving to cheaper capacity")
            return True
        if not [n for n in nodes if n.state == NodeState.LAUNCHING]:
            return self._give_up(s, rec, now, f"the nodes launched in {rec['to_pool']} did not come "
                                 "up, or other work took them")
        return True

    def _placed(self, s: Session, rec: dict[str, Any], now: float) -> bool:
        b = s.get(Attempt, rec.get("new_attempt_id"))
        if b is None:
            return False
        if b.state != AttemptState.ENDED:
            return True
        ran_h = max(0.0, (b.ended_at or now) - b.started_at) / 3600.0
        gpus = b.gpus
        restart_h = (b.restart_overhead_s if b.restart_overhead_s is not None
                     else self.engine.policy.restart_overhead_s) / 3600.0
        cost = (gpus * rec.get("drain_s", 0.0) / 3600.0 * rec["usd_per_gpu_hour_from"]
                + gpus * restart_h * (rec["usd_per_gpu_hour_to"] + self.engine.policy.gpu_hour_value_usd)
                + b.egress_usd)
        if rec["from_pool"] == rec["to_pool"]:  # defragmenting: did the gang start meanwhile?
            gang = int(rec["reason"].rsplit(" ", 1)[-1])
            started = s.exec(select(Attempt).where(Attempt.job_id == gang,
                                                   col(Attempt.started_at) <= (b.ended_at or now))).first()
            gross = rec["saving_usd"] if started is not None else 0.0
        else:
            pools = self.engine.config.pools
            dst = next((p.gpu_type for p in pools if p.name == rec["to_pool"]), "")
            from_ledger = realized_gross(s, rec, b, frozenset(p.name for p in pools if p.rented), dst)
            gross = from_ledger if from_ledger is not None else (
                (rec["usd_per_gpu_hour_from"] - rec["usd_per_gpu_hour_to"]) * gpus * ran_h)
        realized = gross - cost
        record(s, now, "rebalance_realized", f"the move from {rec['from_pool']} to {rec['to_pool']} "
               f"saved ${realized:.2f} (expected ${rec['saving_usd'] - rec['cost_usd']:.2f} net)",
               job_id=b.job_id, attempt_id=b.id, from_pool=rec["from_pool"], to_pool=rec["to_pool"],
               expected_saving_usd=rec["saving_usd"], expected_cost_usd=rec["cost_usd"],
               realized_saving_usd=realized, realized_cost_usd=cost, realized_gross_usd=gross, ran_h=ran_h,
               reason=rec["reason"])
        s.commit()
        return False

    def _give_up(self, s: Session, rec: dict[str, Any], now: float, why: str) -> bool:
        record(s, now, "rebalance_abandoned", f"move to {rec['to_pool']} given up: {why}",
               job_id=rec["job_id"], attempt_id=rec["attempt_id"], to_pool=rec["to_pool"], why=why)
        s.commit()
        return False

    def _still_free(self, s: Session, alloc: list[tuple[str, int]]) -> bool:
        used: dict[str, int] = {}
        for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)):
            for node, slots in a.alloc:
                used[node] = used.get(node, 0) + len(slots)
        for nd, g in alloc:
            n = s.get(Node, nd)
            if n is None or n.state != NodeState.UP or n.gpus - used.get(nd, 0) < g:
                return False
        return True

    # -- cycle hook: after the snapshot ---------------------------------------------------------
    def hold(self, snap: Snapshot, s: Session | None = None) -> Snapshot:
        """The snapshot with in-flight moves' target GPUs taken (as by a stopping attempt)
        and their jobs out of the queue, so the plan neither fills those GPUs nor places the
        jobs elsewhere. A node launched for a move counts as taken from the moment it is up
        (the move claims it at its next step): it is never given back as idle, nor filled by
        other work, in between."""
        if s is None:
            with self.engine.store.session() as s2:
                return self._hold(snap, s2)
        return self._hold(snap, s)

    def _hold(self, snap: Snapshot, s: Session) -> Snapshot:
        moves = load(s)
        held: list[tuple[dict[str, Any], list[tuple[str, int]]]] = []
        for m in moves:
            if m["phase"] in ("checkpointing", "stopping") and m["alloc"]:
                held.append((m, [(nd, g) for nd, g in m["alloc"]]))
            elif m["phase"] == "launching":
                a = s.get(Attempt, m["attempt_id"])
                gpn = len(a.alloc[0][1]) if a is not None and a.alloc else 0
                up = s.exec(select(Node.id).where(Node.pool == m["to_pool"], Node.for_job_id == m["job_id"],
                                                  Node.state == NodeState.UP)).all()
                held.append((m, [(nd, gpn) for nd in up if gpn]))
        if not held:
            return snap
        nodes = {nd.id for p in snap.pools for nd in p.nodes}
        phantoms = tuple(
            RunningView(attempt_id=-m["attempt_id"], job_id=m["job_id"], team="", priority=Priority.LOW,
                        alloc=tuple((nd, g) for nd, g in alloc if nd in nodes),
                        started_at=snap.now, submit_time=snap.now, stopping=True)
            for m, alloc in held)
        jobs = {m["job_id"] for m, _ in held if m["phase"] != "launching"}  # (launching: runs in A)
        return replace(snap, running=snap.running + tuple(p for p in phantoms if p.alloc),
                       pending=tuple(j for j in snap.pending if j.job_id not in jobs),
                       queue=None if jobs else snap.queue)


def dry_run(store: Any, clock: Any) -> tuple[Move, ...]:
    """The moves the leader's next rebalancing round would start now, computed on a read-only
    view of the database (broker.state.store.ReadOnlyStore: whatever the snapshot writes on the
    way is rolled back) without acting and without the lease (`onepool rebalance --dry-run`; a
    broker may be running, or none ever ran). Rented pools are priced as the leader prices
    them; team budgets are not applied (they are the leader's, computed each cycle)."""
    from broker.control.engine import Engine
    from broker.control.lease import Lease
    from broker.state.store import ReadOnlyStore
    from providers.local import LocalProcesses

    view = ReadOnlyStore(getattr(store, "inner", store))  # a FencedStore's database, unfenced
    runs = LocalProcesses(store.home / "runs", containment="group")  # starts nothing: no cgroup probe
    eng = Engine(view, clock, runs, lease=Lease(view, clock, 15.0))
    try:
        return eng.rebalancer.proposals(clock.now())
    finally:
        eng.close()

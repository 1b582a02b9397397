"""The simulator's side of rebalancing: the SAME pure rules (broker.policy.rebalance and
.defrag) replayed on simulated time. Private to broker.sim; the Simulator calls two hooks.

- `after_plan(snap, plan)`: at most every `interval_s` of simulated time (the live broker's
  broker.tasks.rebalance_s), after a plan was applied: the moves that pay now are started.
  A move holds its target GPUs at once, signals the attempt (checkpoint on the signal, like a
  preemption with checkpoint-on-signal: it exits `checkpoint_save_s` later having kept its
  progress) and is placed on the held GPUs when it exits (`resume`), paying the restart
  overhead there like any resumed attempt. The drain and the restart are counted as lost GPU
  time under the cause "rebalance".
- `resume(job)`: from the simulator's attempt-end path; True when the job was moving (it
  was started on its target, not requeued).

Simplifications (each favours rebalancing, and is reported by bench/rebalance.py):
- only moves onto capacity that exists now (free on-prem GPUs, idle rented nodes) and
  defragmentation are replayed; moves that first launch nodes in another pool (on-demand to
  spot, spot to spot, spot off a spiking pool) are not (the trace scenario's prices and
  interruption rates do not move, so such moves would only follow the initial routing);
- checkpoint egress is free (the simulator has no checkpoint sizes);
- the checkpoint the move asks for always commits (no failed saves); jobs that do not
  checkpoint on the signal (the scenario's `checkpoint_on_signal` share) are never moved.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from broker.policy import PendingView, Placement, Plan, Snapshot
from broker.policy.defrag import defrag
from broker.policy.rebalance import AttemptFacts, Move, RebalanceConfig, rebalance
from broker.policy.rebalance_realized import PastMove, realization

BREAKDOWN = (
    "defrag_expected_net_usd",  # defragmenting moves: the gangs' wait value, not money billed
    "move_expected_net_usd",  # moves to cheaper capacity: saving - cost, as decided
    # the same, the saving scaled by the realized ratio in force when decided (= the above
    # when the run is not corrected)
    "defrag_expected_net_corrected_usd", "move_expected_net_corrected_usd",
    "move_cost_usd",
    "move_expected_hours",  # the remaining run time the decisions assumed (summed)
    "move_true_hours",  # the moved attempts' true remaining run time (capped the same way)
    "move_saving_at_true_remaining_usd",  # the per-GPU saving over the true remaining time
    "move_saving_at_true_remaining_node_emptied_usd",  # ... of moves that empty a rented node
    "moves_emptying_a_rented_node",
    "moves_leaving_a_rented_node_busy",  # per-node billing: the bill does not fall at all
    # finished moves (see SimRebalancer._fold): gross saving expected and realized, by kind
    "move_expected_finished_usd", "move_realized_usd", "move_realized_without_displacement_usd",
    "defrag_expected_finished_usd", "defrag_realized_usd",
)
HOLD = -1  # GPUs held for a move are "used" by attempt id HOLD - job id (never a real id)

if TYPE_CHECKING:
    from broker.sim.state import SimAttempt, SimJob
    from broker.sim.world import SimWorld


@dataclass
class _Due:
    """A move whose moved attempt has not ended yet: when it ends, its kind, the expected
    gross saving, and what its realized saving is made of (see SimRebalancer._fold)."""

    end: float
    kind: str
    expected: float
    gang: int = 0  # defrag: the gang job
    per_h: float = 0.0  # move: USD saved per hour (0: its rented node stayed busy)
    idle_usd: float = 0.0  # move: the emptied rented node's idle time before it is given back
    start: float = 0.0
    gpus: int = 0
    to_onprem: bool = False
    to_type: str = ""
    displaced_at: float | None = None


class SimRebalancer:
    def __init__(self, sim: SimWorld, rc: RebalanceConfig, interval_s: float = 300.0,
                 corrected: bool = False) -> None:
        self.sim, self.rc, self.interval_s = sim, rc, interval_s
        # corrected: each round's RebalanceConfig carries what past moves realized
        # (broker.policy.rebalance_realized), as the live broker's does
        self.corrected = corrected
        self.past: list[PastMove] = []
        # moves whose moved attempt has not ended yet (see _Due)
        self.due: list[_Due] = []
        self.last = -interval_s
        self.moving: dict[int, Move] = {}  # job id -> its move, from the signal to the restart
        self.moves = 0
        self.defrag_moves = 0
        self.expected_net_usd = 0.0
        # where the expected saving comes from (bench/rebalance.py's `expected_breakdown`):
        # USD summed over the moves started, see breakdown()
        self.parts: dict[str, float] = {k: 0.0 for k in BREAKDOWN}

    def wants_turn(self, pending: Iterable[PendingView]) -> bool:
        """Whether a round is due and a gang waits long enough for defragmentation (the
        simulator then plans even when its shortcut says the plan would change nothing)."""
        if self.sim.now - self.last < self.interval_s:
            return False
        cut = self.sim.now - self.rc.defrag_after_s
        return any(j.nodes > 1 and j.submit_time <= cut for j in pending)

    def next_turn(self, pending: Iterable[PendingView]) -> float | None:
        """When a waiting gang next becomes due for defragmentation (the simulator wakes then:
        its time rules are exact events, not a periodic tick); None if none waits."""
        due = [j.submit_time + self.rc.defrag_after_s for j in pending if j.nodes > 1]
        if not due:
            return None
        return max(self.last + self.interval_s, min(due), self.sim.now)

    def after_plan(self, snap: Snapshot, p: Plan) -> None:
        sim = self.sim
        if self.due and p.placements:
            self._displaced(p)
        if sim.now - self.last < self.interval_s:
            return
        self.last = sim.now
        self._fold()
        busy = frozenset(self.moving)
        rented = {name for name, pool in sim.pools.items() if pool.rented}
        facts = self._facts(lambda a: a.pool in rented)
        moves = [m for m in rebalance(snap, p, facts, self.rc, busy) if not m.launch]
        if any(j.nodes > 1 and sim.now - j.submit_time >= self.rc.defrag_after_s for j in snap.pending):
            taken = {nd for m in moves for nd, _ in m.alloc}
            gang = defrag(snap, p, self._facts(lambda a: len(a.view.alloc) == 1), self.rc,
                          busy | {m.job_id for m in moves})
            moves += [m for m in gang if not taken & {nd for nd, _ in m.alloc}]
        for m in moves:
            self._start(m)

    def _facts(self, want) -> dict[int, AttemptFacts]:  # type: ignore[no-untyped-def]
        sim, out = self.sim, {}
        for aid, a in sim.running.items():
            # a job that does not checkpoint on the signal never commits the checkpoint a move
            # waits for: the live broker gives such a move up, so it is not replayed
            if a.stop_at is not None or not a.job.saves_on_signal or not want(a):
                continue
            # what the policy's runtime estimate says is left (as the live broker knows it)
            end = a.view.expected_end
            remaining = max(0.0, end - sim.now) if end is not None else None
            out[aid] = AttemptFacts(a.pool, a.job.spot, a.job.types, remaining,
                                    sim.sc.checkpoint_interval_s)
        return out

    def _start(self, m: Move) -> None:
        sim = self.sim
        a = sim.running.get(m.attempt_id)
        if a is None or a.stop_at is not None or a.finish_at <= sim.now + sim.sc.checkpoint_save_s:
            return  # stopping already, or done before the move would be
        pool = sim.pools[m.to_pool]
        if any(nd not in pool.nodes or pool.nodes[nd].gpus - pool.nodes[nd].used < g for nd, g in m.alloc):
            return
        for nd, g in m.alloc:
            pool.use(pool.nodes[nd], g, sim.now, HOLD - m.job_id)  # held from now on
        self._account(m, a)
        self.moving[m.job_id] = m
        self.moves += 1
        self.defrag_moves += m.from_pool == m.to_pool
        self.expected_net_usd += m.saving_usd - m.cost_usd
        sim._stop(a, "rebalance", sim.sc.checkpoint_save_s, sim.sc.grace_s)
        sim.set_view(a, replace(a.view, stopping=True))

    def _displaced(self, p: Plan) -> None:
        """A job placed on rented capacity that could have run on the on-prem GPUs a moved
        job took, while it held them: from then on the move only shifted rented work from
        one job to another (displacement)."""
        sim = self.sim
        for pl in p.placements:
            if not sim.pools[pl.pool].rented:
                continue
            g = sum(n for _, n in pl.alloc)
            types = sim.jobs[pl.job_id - 1].types
            for d in self.due:
                if (d.to_onprem and d.displaced_at is None and d.start < sim.now and g <= d.gpus
                        and (not types or d.to_type in types)):
                    d.displaced_at = sim.now
                    break

    def _fold(self) -> None:
        """Moves whose moved attempt has ended join `past`, with what they realized: a move
        to other capacity, its per-GPU saving from the move until the attempt ended or, onto
        on-prem GPUs, until the queue would have used them (`_displaced`), when it left an
        on-prem pool or emptied its rented node(s) (less the node's idle time until it is
        given back), else 0 (a rented node is billed whole: it kept running for its other
        jobs); a defragmenting move, its share of the gang's wait value if the gang started
        before the moved attempt ended, else 0."""
        now, keep = self.sim.now, []
        for d in self.due:
            if d.end > now:
                keep.append(d)
                continue
            if d.kind == "defrag":
                start = self.sim.jobs[d.gang - 1].first_start
                realized = d.expected if start is not None and start <= d.end else 0.0
            else:
                until = d.end if d.displaced_at is None else min(d.end, d.displaced_at)
                realized = max(0.0, d.per_h * (until - d.start) / 3600.0 - d.idle_usd) if d.per_h else 0.0
                whole = max(0.0, d.per_h * (d.end - d.start) / 3600.0 - d.idle_usd) if d.per_h else 0.0
                self.parts["move_realized_without_displacement_usd"] += whole
            self.past.append(PastMove(d.kind, d.expected, realized))
            self.parts[f"{d.kind}_expected_finished_usd"] += d.expected
            self.parts[f"{d.kind}_realized_usd"] += realized
        self.due = keep
        if self.corrected and self.past:
            self.rc = replace(self.rc, realized_move=realization(self.past, "move"),
                              realized_defrag=realization(self.past, "defrag"))

    def _account(self, m: Move, a: SimAttempt) -> None:
        """Split the move's expected saving by what it rests on (see BREAKDOWN), and keep it
        until its moved attempt ends (`_fold`)."""
        p = self.parts
        net = m.saving_usd - m.cost_usd
        end = min(a.finish_at, self.sim.horizon)
        kind = "defrag" if m.from_pool == m.to_pool else "move"
        ratio = self.rc.realized_defrag if kind == "defrag" else self.rc.realized_move
        p[f"{kind}_expected_net_corrected_usd"] += m.saving_usd * ratio - m.cost_usd
        if kind == "defrag":
            p["defrag_expected_net_usd"] += net
            self.due.append(_Due(end, "defrag", m.saving_usd, gang=int(m.reason.rsplit(" ", 1)[-1])))
            return
        p["move_expected_net_usd"] += net
        p["move_cost_usd"] += m.cost_usd
        gpus = a.view.gpus
        per_h = (m.usd_per_gpu_hour_from - m.usd_per_gpu_hour_to) * gpus
        true_h = min(max(0.0, a.finish_at - self.sim.now), self.rc.max_remaining_s) / 3600.0
        p["move_expected_hours"] += m.saving_usd / per_h if per_h > 0 else 0.0
        p["move_true_hours"] += true_h
        p["move_saving_at_true_remaining_usd"] += per_h * true_h
        src, dst = self.sim.pools[m.from_pool], self.sim.pools[m.to_pool]
        d = _Due(end, "move", m.saving_usd, per_h=per_h, start=self.sim.now, gpus=gpus,
                 to_onprem=not dst.rented, to_type=dst.gpu_type)
        if src.rented:
            left = sum(src.nodes[nd].used for nd, _ in a.view.alloc if nd in src.nodes) - gpus
            if left <= 0:  # the move empties its rented node(s): the bill can fall
                p["move_saving_at_true_remaining_node_emptied_usd"] += per_h * true_h
                p["moves_emptying_a_rented_node"] += 1
                d.idle_usd = src.idle_timeout_s / 3600.0 * len(a.view.alloc) * src.price_per_node_hour
            else:
                p["moves_leaving_a_rented_node_busy"] += 1
                d.per_h = 0.0
        self.due.append(d)

    def breakdown(self) -> dict[str, float]:
        """BREAKDOWN's sums and the ratios the corrected rule last used (at the end of the
        run: moves that ended by then are folded in first)."""
        self._fold()
        out = {k: round(v, 2) for k, v in self.parts.items()}
        out["realized_move"], out["realized_defrag"] = (round(self.rc.realized_move, 4),
                                                        round(self.rc.realized_defrag, 4))
        return out

    def resume(self, j: SimJob) -> bool:
        """Start a moving job on its held GPUs (called when its attempt exits)."""
        m = self.moving.pop(j.jid, None)
        if m is None:
            return False
        sim = self.sim
        pool = sim.pools[m.to_pool]
        for nd, g in m.alloc:
            if nd in pool.nodes:
                pool.use(pool.nodes[nd], -g, sim.now, HOLD - m.job_id)
        if any(nd not in pool.nodes for nd, _ in m.alloc):
            return False  # its target went away (an interrupted node): it queues as usual
        sim._enqueue(j)
        sim._start(Placement(j.jid, m.to_pool, m.alloc, j.cls))
        return True

"""Where an attempt's ranks run: the broker's own slots (providers.local.LocalProcesses), the
agent of the node they were placed on (AgentExecutor), or one Slurm job per attempt
(broker.control.slurm_exec.SlurmExecutor). `Executors` routes by the node's pool provider.

AgentExecutor keeps the Executor contract of providers.base over the database: start() writes
a RankAssignment (idempotent per attempt and rank), the agent picks it up on its next sync,
runs it under the same supervisor as local ranks and reports its state; status() reads what
the agent reported; signal() appends to the rank's signal list, which the agent delivers in
order. A rank on a node declared lost is LOST.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from sqlalchemy.exc import IntegrityError
from sqlmodel import col, select

from broker.clock import Clock
from broker.control.slurm_exec import SLURM, SlurmExecutor
from broker.control.slurm_pools import SlurmPools
from broker.state.model import Node, Pool
from broker.state.model_access import RankAssignment
from broker.state.model_access import RankState as AState
from broker.state.store import Store
from providers.base import Handle, RankState, RankStatus
from providers.local import LocalProcesses

AGENT = "agent"


class AgentExecutor:
    """Ranks run by node agents, through the database. `notify(node)` is called after a
    change an agent should see at once (in `onepool server` it wakes that agent's poll)."""

    def __init__(self, store: Store, clock: Clock,
                 notify: Callable[[str], None] | None = None) -> None:
        self.store, self.clock = store, clock
        self.notify = notify or (lambda node: None)
        self._seen: dict[int, tuple[str, int | None, str | None]] | None = None

    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False, node: str | None = None) -> Handle:
        """Assign the rank to `node`'s agent unless assigned already; return its handle."""
        if node is None:
            raise ValueError("an agent rank needs the node it was placed on")
        row = self._row(attempt_id, rank)
        if row is None:
            try:
                with self.store.session() as s:
                    s.add(RankAssignment(attempt_id=attempt_id, rank=rank, node=node, argv=argv,
                                         env=env, created_at=self.clock.now()))
            except IntegrityError:  # another broker process assigned it first
                pass
            row = self._row(attempt_id, rank)
            assert row is not None
        self.notify(row.node)
        return {"kind": AGENT, "node": row.node, "attempt_id": attempt_id, "rank": rank,
                "assignment_id": row.id}

    def _row(self, attempt_id: int, rank: int) -> RankAssignment | None:
        with self.store.session() as s:
            return s.exec(select(RankAssignment).where(RankAssignment.attempt_id == attempt_id,
                                                       RankAssignment.rank == rank)).first()

    _Q = (select(RankAssignment.id, RankAssignment.state, RankAssignment.exit_code, Node.state,
                 RankAssignment.cause)
          .join(Node, col(Node.id) == RankAssignment.node, isouter=True))

    @staticmethod
    def _state(st: str, code: int | None, node_state: str | None,
               cause: str | None = None) -> tuple[str, int | None, str | None]:
        """A rank still running on a node confirmed gone died with it. `cause`: why the agent
        could not start it (start_failed:<kind>), or why it stopped itself (server_unreachable)."""
        if node_state == "terminated" and st in (AState.ASSIGNED, AState.RUNNING):
            return AState.LOST, None, None
        return st, code, cause

    def refresh(self, attempt_ids: list[int]) -> None:
        """Read the reported state of these attempts' ranks in one query; status() answers from
        it until the next refresh (the engine calls this once per poll)."""
        rows: list[tuple[int | None, str, int | None, str | None, str | None]] = []
        with self.store.session() as s:
            for i in range(0, len(attempt_ids), 500):
                chunk = attempt_ids[i:i + 500]
                rows += s.exec(self._Q.where(col(RankAssignment.attempt_id).in_(chunk))).all()
        self._seen = {i: self._state(st, code, ns, cause) for i, st, code, ns, cause in rows
                      if i is not None}

    def status(self, handle: Handle) -> RankStatus:
        got = self._seen.get(handle["assignment_id"]) if self._seen is not None else None
        if got is None:
            with self.store.session() as s:
                row = s.exec(self._Q.where(RankAssignment.id == handle["assignment_id"])).first()
            got = None if row is None else self._state(row[1], row[2], row[3], row[4])
        if got is None:
            return RankStatus(RankState.LOST)
        if got[0] == AState.LOST:  # with its cause and code when it stopped itself (server_unreachable)
            return RankStatus(RankState.LOST, got[1] if got[2] else None, cause=got[2])
        if got[0] == AState.EXITED:
            return RankStatus(RankState.EXITED, got[1], cause=got[2])
        return RankStatus(RankState.RUNNING)

    def signal(self, handle: Handle, sig: int) -> None:
        """Queue `sig` for the rank; quietly nothing if it has ended."""
        with self.store.session() as s:
            row = s.get(RankAssignment, handle["assignment_id"])
            if row is None or row.state in (AState.EXITED, AState.LOST):
                return
            seq = (row.signals[-1][0] if row.signals else 0) + 1
            row.signals = [*row.signals, [seq, int(sig)]]
            s.add(row)
            node = row.node
        self.notify(node)


class Executors:
    """The engine's executor: routes each rank to the local slots, its node's agent, or Slurm.

    A node is served by an agent unless its pool's provider is `local` (the broker's own
    machine) or `slurm` (the pool's Slurm partition runs it). `wait_for_change` returns when a
    local rank exits or `changed()` is called
    (the API calls it when an agent reports)."""

    def __init__(self, store: Store, clock: Clock, runs_dir: str | os.PathLike[str], *,
                 on_change: Callable[[], None] | None = None,
                 notify: Callable[[str], None] | None = None) -> None:
        self._event = threading.Event()
        self._on_change = on_change
        self.local = LocalProcesses(runs_dir, on_change=self.changed)
        self.agents = AgentExecutor(store, clock, notify)
        self.slurm = SlurmPools(store, clock)
        self._provider: dict[str, str] = {}

    def provider(self, node: str) -> str:
        """The provider of `node`'s pool (cached: a node never changes pool); "local" if unknown."""
        if node not in self._provider:
            with self.agents.store.session() as s:
                row = s.exec(select(Pool.provider).join(Node, col(Node.pool) == Pool.name)
                             .where(Node.id == node)).first()
            self._provider[node] = row or "local"
        return self._provider[node]

    def is_remote(self, node: str) -> bool:
        """Whether `node` is served by an agent."""
        return self.provider(node) not in ("local", SLURM)

    def start(self, attempt_id: int, rank: int, argv: list[str], env: dict[str, str],
              *, recover: bool = False, node: str | None = None) -> Handle:
        provider = "local" if node is None else self.provider(node)
        if provider == SLURM:
            return self.slurm.executor.start(attempt_id, rank, argv, env, recover=recover, node=node)
        if provider != "local":
            return self.agents.start(attempt_id, rank, argv, env, recover=recover, node=node)
        return self.local.start(attempt_id, rank, argv, env, recover=recover)

    def _for(self, handle: Handle) -> LocalProcesses | AgentExecutor | SlurmExecutor:
        kind = handle.get("kind")
        return self.agents if kind == AGENT else self.slurm.executor if kind == SLURM else self.local

    def status(self, handle: Handle) -> RankStatus:
        return self._for(handle).status(handle)

    def signal(self, handle: Handle, sig: int) -> None:
        self._for(handle).signal(handle, sig)

    def phases(self, handle: Handle) -> dict[str, float | bool] | None:
        """A local rank's restart phases (agents report theirs with their syncs)."""
        ex = self._for(handle)
        return ex.phases(handle) if isinstance(ex, LocalProcesses) else None

    def refresh(self, attempt_ids: list[int]) -> None:
        """Start of a poll: agents' reports are read once for all these attempts' ranks."""
        self.agents.refresh(attempt_ids)

    def changed(self) -> None:
        """Something an engine cycle should look at happened (a rank exited, an agent
        reported)."""
        self._event.set()
        if self._on_change is not None:
            self._on_change()

    def wait_for_change(self, timeout: float) -> bool:
        """Block until a local rank exits or changed() is called, or timeout. True if so."""
        hit = self._event.wait(timeout)
        self._event.clear()
        return hit

"""SDK methods about who acts and where work runs: tokens, node join tokens, nodes and health.

Mixed into broker.client.sdk.Client (which provides `store`, `clock`, `principal`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from broker.control.config_apply import applied_config
from broker.errors import InvalidState, NotFound, SpecError
from broker.state.events import acting_as, record
from broker.state.model import Job, Node, Pool
from broker.state.model_access import ApiToken
from broker.state.tokens import create_api_token, new_join_token, revoke_api_token
from broker.state.views import JoinTokenInfo, NodeInfo, TokenInfo
from broker.wire import MoveInfo

if TYPE_CHECKING:
    from broker.clock import Clock
    from broker.state.store import Store
    from broker.state.tokens import Principal



def visible_nodes(s: Session, principal: Principal, nodes: list[NodeInfo]) -> list[NodeInfo]:
    """`nodes` as `principal` may see them: an admin sees every job holding GPUs; a member
    sees only its own team's job ids there (other teams' work shows as used GPUs, no more)."""
    if principal.is_admin:
        return nodes
    held = {j for n in nodes for j in n.jobs}
    mine = set(s.exec(select(Job.id).where(col(Job.id).in_(held), Job.team == principal.team)).all())
    return [n if set(n.jobs) <= mine else n.model_copy(update={"jobs": [j for j in n.jobs if j in mine]})
            for n in nodes]


def _token_info(row: ApiToken, token: str | None = None) -> TokenInfo:
    return TokenInfo(id=row.id, team=row.team, role=row.role, note=row.note, user=row.user,
                     created_at=row.created_at, created_by=row.created_by,
                     revoked_at=row.revoked_at, token=token)


class AdminMixin:
    store: Store
    clock: Clock
    principal: Principal

    # -- tokens -------------------------------------------------------------------------------
    def create_token(self, team: str, role: str = "member", note: str = "",
                     user: str | None = None) -> TokenInfo:
        """A new API token for `team` with `role` (member|lead|admin|metrics), belonging to the
        person `user` (None: the whole team; see broker.state.access for what each may do).
        The answer carries the token itself, the only time it is shown. Admins only; raises
        Forbidden, SpecError."""
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            token, row = create_api_token(s, team, role, self.principal, now, note, user)
            whose = f" for {user} of team {team}" if user else f" for team {team}"
            record(s, now, "token_created", f"{role} token {row.id}{whose}",
                   token_id=row.id, team=team, role=role, user=user)
            return _token_info(row, token)

    def revoke_token(self, token_id: str) -> TokenInfo:
        """Revoke a token: every later request with it gets 401. Admins only; raises
        Forbidden, NotFound."""
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            row = revoke_api_token(s, token_id, self.principal, now)
            record(s, now, "token_revoked", f"token {row.id} of team {row.team} revoked",
                   token_id=row.id, team=row.team)
            return _token_info(row)

    def tokens(self) -> list[TokenInfo]:
        """Every token (without secrets). Admins only."""
        self.principal.require_admin("listing tokens")
        with self.store.session() as s:
            return [_token_info(r) for r in s.exec(select(ApiToken).order_by(col(ApiToken.created_at)))]

    # -- nodes served by agents ----------------------------------------------------------------
    def join_token(self, node: str, ttl_s: float = 3600.0) -> JoinTokenInfo:
        """A one-time token with which `onepool agent` joins as `node` (a node of a pool with
        `provider: agent`). A node that already has an agent gets a fresh token: the next
        join replaces the old agent's credential. Admins only; raises Forbidden, NotFound,
        SpecError (a node no agent can serve)."""
        self.principal.require_admin("creating join tokens")
        if not 0 < ttl_s <= 30 * 86400:
            raise SpecError("join-token", [f"ttl_s: must be > 0 and at most 30 days (got {ttl_s})"])
        now = self.clock.now()
        with self.store.session() as s, acting_as(self.principal.actor):
            row = s.get(Node, node)
            if row is None:
                agent_nodes = s.exec(select(Node.id).join(Pool, col(Pool.name) == Node.pool)
                                     .where(Pool.provider == "agent")).all()
                raise NotFound(f"no node {node!r}; nodes served by agents: "
                               f"{', '.join(agent_nodes) or '(none: add a pool with provider: agent)'}")
            pool = s.get(Pool, row.pool)
            if pool is None or pool.provider != "agent":
                raise SpecError("join-token", [
                    f"node: {node} is in pool {row.pool} (provider {pool.provider if pool else '?'}); "
                    "join tokens are for pools with provider: agent (rented nodes get theirs "
                    "from the broker at launch)"])
            if row.state == "retired":
                raise InvalidState(f"node {node} is retired (its pool has fewer nodes now)")
            token = new_join_token(s, node, now, ttl_s)
            record(s, now, "join_token_created", f"join token for node {node} (valid {ttl_s:g}s)",
                   node=node, pool=row.pool)
            return JoinTokenInfo(node=node, pool=row.pool, join_token=token, expires_at=now + ttl_s)

    def nodes(self, pool: str | None = None) -> list[NodeInfo]:
        """Nodes that are or may become schedulable (agent-served ones waiting for or having
        lost their agent included), with their free GPUs and agents, and the jobs holding the
        rest (a member: its own team's only). Raises NotFound for an unknown pool."""
        from broker.state import inventory

        with self.store.session() as s:
            cfg = applied_config(s)
            if pool is not None and pool not in {p.name for p in cfg.pools}:
                raise NotFound(f"no pool {pool!r}; pools: {', '.join(p.name for p in cfg.pools)}")
            pools = inventory.pools(s, cfg, self.clock.now())
            return visible_nodes(s, self.principal,
                                 [n for p in pools if pool is None or p.name == pool for n in p.nodes])

    # -- replaying the history (issue 31) --------------------------------------------------------
    def replay(self, sets: list[str] | None = None, config: dict[str, Any] | None = None,
               since: float | None = None) -> dict[str, Any]:
        """Replay this broker's history (jobs submitted since `since`, default all) in the
        simulator under the applied config and under a changed one: the applied config with
        `sets` (PATH=VALUE, broker.spec_set) applied, or `config` (a whole onepool.yaml as a
        mapping) with them. Returns broker.sim.replay.compare's result. Admins only (it reads
        every team's jobs). Raises SpecError naming a bad key or value, Forbidden."""
        from broker.spec import parse_config
        from broker.spec_set import with_sets
        from broker.state.history import replay_history

        self.principal.require_admin("replaying the broker's history (every team's jobs)")
        with self.store.session() as s:
            cfg = applied_config(s)
            base = parse_config(config, "--config") if config is not None else cfg
            changed = with_sets(base, list(sets or []))
            return replay_history(s, cfg, changed, self.clock.now(), since)

    def rebalance_history(self, limit: int = 200) -> dict[str, Any]:
        """The newest `limit` finished moves with their expected and realized saving, and per
        kind the totals and the ratio that corrects the next decisions
        (broker.control.rebalance_history.history). A member sees its own team's moves."""
        from broker.control.rebalance_history import history

        if not 1 <= limit <= 10_000:
            raise SpecError("rebalance", [f"limit: must be 1..10000 (got {limit})"])
        with self.store.session() as s:
            jobs = None
            if not self.principal.is_admin:
                jobs = set(s.exec(select(Job.id).where(Job.team == self.principal.team)).all())
            return history(s, limit, {j for j in jobs if j is not None} if jobs is not None else None)

    # -- rebalancing (issue 12) ------------------------------------------------------------------
    def rebalance_dry_run(self) -> list[MoveInfo]:
        """The moves the leader's next rebalancing round would start now, computed on a
        read-only snapshot of the database: no lease needed, nothing written (a broker may be
        running, or none ever ran). A member sees the moves of its own team's jobs only."""
        from broker.control.rebalancer import dry_run

        moves = [MoveInfo.model_validate(m.as_dict()) for m in dry_run(self.store, self.clock)]
        if self.principal.is_admin or not moves:
            return moves
        with self.store.session() as s:
            mine = set(s.exec(select(Job.id).where(col(Job.id).in_([m.job for m in moves]),
                                                   Job.team == self.principal.team)).all())
        return [m for m in moves if m.job in mine]

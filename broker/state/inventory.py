"""What capacity exists now: every pool with its price in force and its live nodes, each with
its free GPUs, the jobs holding the rest, and its age. Read by `onepool pools` (through the
SDK) and the dashboard's Nodes & pools tab."""

from __future__ import annotations

from collections import defaultdict

from sqlmodel import Session, col, select

from broker.errors import Unpriced
from broker.spec import ClusterConfig
from broker.state.ledger import price_in_force, usd_per_gpu_hour
from broker.state.model import Attempt, AttemptState, Node, NodeMeter, NodeState, Pool
from broker.state.model_access import NodeAgent
from broker.state.views import NodeInfo, PoolInfo

LIVE = (NodeState.LAUNCHING, NodeState.UP, NodeState.DRAINING, NodeState.TERMINATING,
        NodeState.WAITING, NodeState.LOST)


def pools(s: Session, cfg: ClusterConfig, now: float, *, include_inactive: bool = False) -> list[PoolInfo]:
    """Pools (active ones unless asked) by name, with their live nodes by id."""
    held: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for a in s.exec(select(Attempt).where(Attempt.state != AttemptState.ENDED)):
        for node, slots in a.alloc:
            held[node][a.job_id] += len(slots)
    first_metered = {m.node: m.started_at for m in s.exec(
        select(NodeMeter).where(col(NodeMeter.ended_at).is_(None)))}
    rows = s.exec(select(Node).where(col(Node.state).in_(list(LIVE))).order_by(Node.id)).all()
    agents = {a.node: a for a in s.exec(select(NodeAgent).where(
        col(NodeAgent.node).in_([n.id for n in rows])))}
    pool_rows = {p.name: p for p in s.exec(select(Pool))}
    nodes: dict[str, list[NodeInfo]] = defaultdict(list)
    for n in rows:
        since = n.launched_at if n.launched_at is not None else first_metered.get(n.id)
        used = sum(held[n.id].values())
        prow, ag = pool_rows.get(n.pool), agents.get(n.id)
        provider = prow.provider if prow is not None else "local"
        nodes[n.pool].append(NodeInfo(
            id=n.id, pool=n.pool, state=n.state, gpus=n.gpus,
            free_gpus=max(0, n.gpus - used) if n.state == NodeState.UP else 0,
            jobs=sorted(held[n.id]), since=since, age_s=None if since is None else now - since,
            instance_id=n.instance_id, zone=n.zone,
            gpu_type=prow.gpu_type if prow is not None else "",
            market=prow.market if prow is not None else "",
            executor=provider if provider in ("local", "slurm") else "agent",
            agent_seen_s_ago=None if ag is None or ag.seen_at is None else max(0.0, now - ag.seen_at),
            agent=dict(ag.info) if ag is not None else {}))
    specs = {p.name: p for p in cfg.pools}
    out = []
    q = select(Pool).order_by(Pool.name)
    for p in s.exec(q if include_inactive else q.where(Pool.active)):
        node_h: float | None
        gpu_h: float | None
        why = None
        try:
            node_h = price_in_force(s, p, now, cfg)
            gpu_h = usd_per_gpu_hour(p, node_h, cfg)
        except Unpriced as e:
            node_h, gpu_h, why = None, None, str(e)
        spec = specs.get(p.name)
        out.append(PoolInfo(name=p.name, provider=p.provider, market=p.market, gpu_type=p.gpu_type,
                            gpus_per_node=p.gpus_per_node, region=p.region, active=p.active,
                            max_nodes=spec.max_nodes if spec else None, usd_per_node_hour=node_h,
                            usd_per_gpu_hour=gpu_h, unpriced=why, nodes=nodes.get(p.name, [])))
    return out

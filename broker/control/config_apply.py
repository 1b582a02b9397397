"""Apply a validated onepool.yaml to the database: teams, pools, nodes, settings."""

from __future__ import annotations

import functools
import json

from sqlmodel import Session, select

from broker.errors import NotConfigured, SpecError, Unpriced
from broker.spec import ClusterConfig, parse_config
from broker.state.model import Node, NodeState, Pool, Setting, Team
from broker.state.model_access import NodeAgent

CONFIG_KEY = "config"
RENTED_KEY = "rented_pools"


def apply_config(s: Session, cfg: ClusterConfig) -> None:
    """Upsert teams and pools, create or retire nodes to match, and store the config.

    A pool dropped from the config is deactivated (its history stays); nodes beyond a
    pool's new count are retired (work running there finishes, nothing new lands).
    Raises SpecError, before writing anything, for a rented pool nothing prices.
    """
    check_prices(cfg)
    for t in cfg.teams:
        row = s.get(Team, t.name) or Team(name=t.name)
        row.weight, row.priority_allowance_gpus = t.weight, t.priority_allowance_gpus
        s.add(row)
    names = {p.name for p in cfg.pools}
    for old in s.exec(select(Pool)).all():
        if old.name not in names:
            old.active = False
            s.add(old)
    for p in cfg.pools:
        row = s.get(Pool, p.name) or Pool(name=p.name, provider=p.provider, gpu_type=p.gpu_type,
                                          gpus_per_node=p.gpus_per_node, nodes=p.nodes)
        for k in ("provider", "gpu_type", "gpus_per_node", "nodes", "region",
                  "price_per_node_hour", "store"):
            setattr(row, k, getattr(p, k))
        row.market, row.active = p.market.value, True
        s.add(row)
        s.flush()
        if p.rented:  # rented nodes are launched and ended by broker.control.capacity_manager
            continue
        if p.provider == "slurm":  # read from Slurm every cycle (broker.control.slurm_pools)
            continue
        for i in range(max(p.nodes, _node_count(s, p.name))):
            nid = f"{p.name}-{i}"
            node = s.get(Node, nid) or Node(id=nid, pool=p.name, gpus=p.gpus_per_node,
                                            state=_first_state(p.provider))
            node.gpus = _gpus(s, nid, p.provider, p.gpus_per_node)
            if i >= p.nodes:
                node.state = NodeState.RETIRED
            elif node.state == NodeState.RETIRED or p.provider == "local":
                node.state = _first_state(p.provider)
            s.add(node)
    setting = s.get(Setting, CONFIG_KEY) or Setting(key=CONFIG_KEY)
    setting.value = cfg.model_dump(mode="json")
    s.add(setting)
    # Every rented pool ever applied (its newest spec): the broker still needs a removed
    # pool's provider to drain and terminate its nodes (broker.control.capacity_manager).
    rented = s.get(Setting, RENTED_KEY) or Setting(key=RENTED_KEY)
    rented.value = {**rented.value, **{p.name: p.model_dump(mode="json") for p in cfg.pools if p.rented}}
    s.add(rented)


def _gpus(s: Session, node: str, provider: str, pool_gpus: int) -> int:
    """A node's GPUs: the pool's, or for an agent-served node what its agent reported at its
    last join, up to the pool's (broker.control.agents.join)."""
    agent = s.get(NodeAgent, node) if provider == "agent" else None
    reported = None if agent is None or agent.credential_id is None else agent.info.get("gpus")
    if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0:
        return min(reported, pool_gpus)
    return pool_gpus


def _first_state(provider: str) -> str:
    """Local slots are up at once; an agent-served node is up once its agent joins."""
    return NodeState.WAITING if provider == "agent" else NodeState.UP


def check_prices(cfg: ClusterConfig) -> None:
    """Every rented pool has a price: its own `price_per_node_hour` or the catalog's (an AWS
    zone may be named, us-east-1a, or given by id, use1-az1). Raises SpecError naming each
    pool without one: a pool nobody can price would look free to the planner and to budgets."""
    from broker.state.ledger import catalog_offer

    problems = []
    for i, p in enumerate(cfg.pools):
        if p.rented and not p.price_per_node_hour:
            try:
                catalog_offer(p)
            except Unpriced as e:
                problems.append(f"pools.{i}.price_per_node_hour: {e}")
    if problems:
        raise SpecError("onepool.yaml", problems)


def _node_count(s: Session, pool: str) -> int:
    return len(s.exec(select(Node.id).where(Node.pool == pool)).all())


def applied_config(s: Session) -> ClusterConfig:
    """The config last applied. Raises NotConfigured if none was."""
    row = s.get(Setting, CONFIG_KEY)
    if row is None:
        raise NotConfigured("no onepool.yaml has been applied to this broker home yet: "
                            "run `onepool apply -c onepool.yaml` (or start `onepool broker -c ...`)")
    return _parsed(json.dumps(row.value, sort_keys=True))


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> ClusterConfig:
    """Validating the stored config costs ~1 ms; it changes rarely (the model is frozen)."""
    return parse_config(json.loads(text), "stored config")

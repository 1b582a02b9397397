"""Small builders for policy snapshots, and readers that turn a Plan into plain data.

Node ids are "<pool>-<i>", so pool("a", nodes=2) has nodes "a-0" and "a-1".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from broker.policy import (
    NodeView,
    PendingView,
    Plan,
    PolicyConfig,
    PoolView,
    RunningView,
    Snapshot,
    TeamView,
)
from broker.spec import Market, Priority, SpotPolicy

NOW = 1000.0


def pool(
    name: str,
    gpu_type: str = "A100",
    nodes: int = 2,
    gpus: int = 8,
    market: str = "onprem",
    price: float = 0.0,
    teams: Iterable[str] | None = None,
) -> PoolView:
    return PoolView(
        name=name,
        gpu_type=gpu_type,
        gpus_per_node=gpus,
        nodes=tuple(NodeView(f"{name}-{i}", gpus) for i in range(nodes)),
        market=Market(market),
        price_per_gpu_hour=price,
        teams=frozenset(teams) if teams is not None else None,
    )


def job(
    id: int,
    team: str = "a",
    prio: str = "normal",
    gpus: int = 1,
    nodes: int = 1,
    types: Iterable[str] = (),
    submit: float = 0.0,
    spot: str = "allowed",
    estimate: float | None = None,
) -> PendingView:
    return PendingView(
        job_id=id,
        team=team,
        priority=Priority(prio),
        gpus_per_node=gpus,
        submit_time=submit,
        nodes=nodes,
        gpu_types=tuple(types),
        spot=SpotPolicy(spot),
        expected_duration_s=estimate,
    )


def running(
    aid: int,
    job_id: int,
    team: str = "x",
    prio: str = "low",
    alloc: Mapping[str, int] | None = None,
    started: float = 0.0,
    ckpt: float | None = None,
    preempted: int = 0,
    stopping: bool = False,
    stopping_for: int | None = None,
    submit: float | None = None,
    end: float | None = None,
) -> RunningView:
    alloc = {"a-0": 8} if alloc is None else alloc
    return RunningView(
        attempt_id=aid,
        job_id=job_id,
        team=team,
        priority=Priority(prio),
        alloc=tuple(alloc.items()),
        started_at=started,
        submit_time=started if submit is None else submit,
        last_checkpoint_at=ckpt,
        times_preempted=preempted,
        stopping=stopping,
        stopping_for=stopping_for,
        expected_end=end,
    )


def team(name: str, weight: float = 1.0, allowance: int = 1 << 30, usage: float = 0.0) -> TeamView:
    return TeamView(name=name, weight=weight, priority_allowance_gpus=allowance, usage=usage)


def snap(
    pools: Iterable[PoolView] = (),
    running: Iterable[RunningView] = (),
    pending: Iterable[PendingView] = (),
    teams: Iterable[TeamView] = (),
    now: float = NOW,
    **config: object,
) -> Snapshot:
    pools = tuple(pools) or (pool("a"),)
    # The reservation tests were written for one holder of free GPUs (easy=False); EASY and
    # the product default are tested on their own in test_backfill.py.
    config.setdefault("reservations", 1)
    config.setdefault("easy", False)
    return Snapshot(
        now=now,
        pools=pools,
        running=tuple(running),
        pending=tuple(pending),
        teams=tuple(teams),
        config=PolicyConfig(**config),  # type: ignore[arg-type]
    )


# -- reading a Plan ---------------------------------------------------------------------------


def placed(p: Plan) -> dict[int, tuple[str, dict[str, int]]]:
    """{job_id: (pool, {node: gpus})}."""
    return {pl.job_id: (pl.pool, dict(pl.alloc)) for pl in p.placements}


def placed_order(p: Plan) -> list[int]:
    return [pl.job_id for pl in p.placements]


def placed_pools(p: Plan) -> dict[int, str]:
    return {pl.job_id: pl.pool for pl in p.placements}


def preempted(p: Plan) -> list[int]:
    """Attempt ids, in plan order."""
    return [pe.attempt_id for pe in p.preemptions]


def preempted_for(p: Plan) -> list[tuple[int, int]]:
    """(attempt_id, for_job_id), in plan order."""
    return [(pe.attempt_id, pe.for_job_id) for pe in p.preemptions]


def held(p: Plan) -> dict[int, dict[str, int]]:
    """{job_id: {node: gpus held}}."""
    return {jid: dict(alloc) for jid, alloc in p.reservations}


def waiting(p: Plan) -> dict[int, str]:
    return dict(p.waiting)

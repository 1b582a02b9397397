"""The pure rebalancing and defragmentation rules (broker.policy.rebalance, .defrag)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.policy import plan
from broker.policy.defrag import defrag
from broker.policy.rebalance import AttemptFacts, RebalanceConfig, rebalance
from broker.spec import Priority, SpotPolicy

from .builders import job, pool, running, snap

HOUR = 3600.0


def rented(name: str, market: str, price: float, rate: float = 0.0, nodes: int = 0,
           max_nodes: int = 4, gpus: int = 8, latency: float = 120.0):  # type: ignore[no-untyped-def]
    return replace(pool(name, nodes=nodes, gpus=gpus, market=market, price=price),
                   max_nodes=max_nodes, interruption_rate_per_h=rate, launch_latency_s=latency)


def facts(pool_name: str, remaining_h: float | None = 10.0, spot: str = "allowed",
          egress: tuple[tuple[str, float], ...] = ()) -> AttemptFacts:
    return AttemptFacts(pool_name, SpotPolicy(spot), (), None if remaining_h is None else remaining_h * HOUR,
                        egress_usd=egress)


def moves_of(s, fs, **rc):  # type: ignore[no-untyped-def]
    return [(m.job_id, m.from_pool, m.to_pool, m.reason, m.launch)
            for m in rebalance(s, plan(s), fs, RebalanceConfig(**rc))]


# (case, pools, attempt pool, remaining hours, spot policy, expected moves)
CASES = [
    ("on-demand to freed on-prem: pays", [rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=1)],
     "od", 10.0, "allowed", [(1, "od", "prem", "on-demand to freed on-prem", 0)]),
    ("on-demand to freed on-prem: 3 minutes left do not pay the restart", [
        rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=1)], "od", 0.05, "allowed", []),
    ("on-demand to spot, allowed: launches a spot node", [
        rented("od", "on_demand", 4.0, nodes=1), rented("sp", "spot", 1.2, rate=0.01)],
     "od", 10.0, "allowed", [(1, "od", "sp", "on-demand to spot", 1)]),
    ("on-demand to spot, spot never: stays", [
        rented("od", "on_demand", 4.0, nodes=1), rented("sp", "spot", 1.2, rate=0.01)],
     "od", 10.0, "never", []),
    ("spot to a cheaper spot region", [
        rented("sp1", "spot", 2.0, rate=0.01, nodes=1), rented("sp2", "spot", 1.0, rate=0.01)],
     "sp1", 10.0, "allowed", [(1, "sp1", "sp2", "spot to cheaper spot", 1)]),
    ("spot whose interruption rate spiked, to on-demand", [
        rented("sp", "spot", 1.5, rate=30.0, nodes=1), rented("od", "on_demand", 4.0)],
     "sp", 10.0, "allowed", [(1, "sp", "od", "interruption rate spike", 1)]),
    ("spot at a normal rate stays on spot", [
        rented("sp", "spot", 1.5, rate=0.02, nodes=1), rented("od", "on_demand", 4.0)],
     "sp", 10.0, "allowed", []),
    ("no free on-prem, no quota: stays", [
        rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=0)], "od", 10.0, "allowed", []),
]


@pytest.mark.parametrize(("case", "pools", "where", "hours", "spot", "want"), CASES,
                         ids=[c[0] for c in CASES])
def test_rebalance_moves_only_when_the_saving_exceeds_the_cost(case, pools, where, hours, spot, want) -> None:  # type: ignore[no-untyped-def]
    r = running(1, 1, alloc={f"{where}-0": 8}, started=0.0)
    s = snap(pools, [r], now=2 * HOUR, min_run_s=300.0)
    assert moves_of(s, {1: facts(where, hours, spot)}) == want


def test_saving_and_cost_are_what_the_docstring_says() -> None:
    s = snap([rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=1)],
             [running(1, 1, alloc={"od-0": 8})], now=HOUR, restart_overhead_s=180.0,
             gpu_hour_value_usd=2.0)
    (m,) = rebalance(s, plan(s), {1: facts("od", 10.0, egress=(("prem", 0.9),))},
                     RebalanceConfig(checkpoint_save_s=60.0))
    assert m.saving_usd == pytest.approx(8 * 4.0 * 10.0)
    # restart in B at (0 + $2 value), save in A at $4, the egress to B's store
    assert m.cost_usd == pytest.approx(8 * 180 / 3600 * 2.0 + 8 * 60 / 3600 * 4.0 + 0.9)
    assert m.alloc == (("prem-0", 8),)


def test_unknown_remaining_time_is_as_long_again_as_it_ran() -> None:
    pools = [rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=1)]
    fs = {1: facts("od", None)}
    young = snap(pools, [running(1, 1, alloc={"od-0": 8}, started=HOUR - 60)], now=HOUR, min_run_s=0)
    old = snap(pools, [running(1, 1, alloc={"od-0": 8}, started=0.0)], now=HOUR, min_run_s=0)
    assert moves_of(young, fs) == []  # a minute run: ~$0.5 saving does not pay a $1.3 move
    assert [m[2] for m in moves_of(old, fs)] == ["prem"]


def test_the_queue_comes_first_and_stopping_or_young_attempts_stay() -> None:
    pools = [rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=1)]
    r = running(1, 1, alloc={"od-0": 8})
    waiting = job(7, gpus=8, submit=0.0)  # plan places it on prem: nothing left to move onto
    assert moves_of(snap(pools, [r], [waiting], now=HOUR), {1: facts("od")}) == []
    assert moves_of(snap(pools, [replace(r, stopping=True)], now=HOUR), {1: facts("od")}) == []
    assert moves_of(snap(pools, [replace(r, started_at=HOUR - 10)], now=HOUR, min_run_s=300.0),
                    {1: facts("od")}) == []
    s = snap(pools, [r], now=HOUR)
    assert rebalance(s, plan(s), {1: facts("od")}, busy=frozenset({1})) == ()


def test_moves_share_the_free_capacity_best_saving_first() -> None:
    pools = [rented("od", "on_demand", 4.0, nodes=2), pool("prem", nodes=1)]
    rs = [running(1, 1, alloc={"od-0": 8}), running(2, 2, alloc={"od-1": 8})]
    fs = {1: facts("od", 2.0), 2: facts("od", 20.0)}
    assert moves_of(snap(pools, rs, now=HOUR), fs) == [(2, "od", "prem", "on-demand to freed on-prem", 0)]
    assert moves_of(snap(pools, rs, now=HOUR), fs, max_moves=0) == []


# -- defragmentation ---------------------------------------------------------------------------
def scattered(n_small: int = 4):  # type: ignore[no-untyped-def]
    """4 nodes x 2 GPUs, a 1-GPU job on each of the first n_small nodes."""
    return [running(i, 100 + i, alloc={f"a-{i - 1}": 1}, started=0.0) for i in range(1, n_small + 1)]


def test_a_gang_that_fits_only_after_two_small_jobs_move() -> None:
    rs = scattered()
    gang = job(9, gpus=2, nodes=2, submit=0.0)
    s = snap([pool("a", nodes=4, gpus=2)], rs, [gang], now=2 * HOUR, min_run_s=0)
    p = plan(s)
    assert 9 not in {pl.job_id for pl in p.placements}
    moves = defrag(s, p, {r.attempt_id: facts("a") for r in rs})
    assert len(moves) == 2
    cleared = {r.alloc[0][0] for r in rs if r.attempt_id in {m.attempt_id for m in moves}}
    targets = {m.alloc[0][0] for m in moves}
    assert not cleared & targets and all(m.from_pool == m.to_pool == "a" for m in moves)
    assert all(m.reason == "defragment for gang job 9" for m in moves)
    # after the moves, the plan places the gang
    moved = {m.attempt_id: m.alloc for m in moves}
    after = replace(s, running=tuple(replace(r, alloc=moved.get(r.attempt_id, r.alloc)) for r in rs))
    assert {pl.job_id for pl in plan(after).placements} == {9}


@pytest.mark.parametrize(("case", "kw", "gang_kw", "fs_all"), [
    ("not waited long enough", {"now": 600.0}, {}, True),
    ("the GPUs are not there at all", {}, {"gpus": 2, "nodes": 3}, True),
    ("small jobs of a higher class stay", {"prio": "high"}, {}, True),
    ("attempts without facts are not moved", {}, {}, False),
])
def test_no_defrag(case, kw, gang_kw, fs_all) -> None:  # type: ignore[no-untyped-def]
    rs = [replace(r, priority=Priority(kw.get("prio", "low"))) for r in scattered()]
    gang = job(9, **{"gpus": 2, "nodes": 2, "submit": 0.0, **gang_kw})
    s = snap([pool("a", nodes=4, gpus=2)], rs, [gang], now=kw.get("now", 2 * HOUR), min_run_s=0)
    fs = {r.attempt_id: facts("a") for r in rs} if fs_all else {}
    assert defrag(s, plan(s), fs) == ()


# (case, remaining hours, realized_move, expected moves): 8 GPUs from on-demand at $4/GPU-h to
# free on-prem save $320 over 10 h ($10.67 over 20 min) for a $1.33 move; min_saving_usd $1
CORRECTED = [
    ("no history: the estimate as it is", 10.0, 1.0, 1),
    ("past moves realized half: 10 h still pays", 10.0, 0.5, 1),
    ("past moves realized 0.5%: 10 h no longer pays ($1.60 - $1.33 < $1)", 10.0, 0.005, 0),
    ("past moves realized half: 20 min still pays", 1 / 3, 0.5, 1),
    ("past moves realized 10%: 20 min no longer pays ($1.07 < $1.33)", 1 / 3, 0.1, 0),
    ("past moves realized nothing: nothing moves", 10.0, 0.0, 0),
]


@pytest.mark.parametrize(("case", "hours", "ratio", "n"), CORRECTED, ids=[c[0] for c in CORRECTED])
def test_a_move_pays_only_once_corrected_by_what_past_moves_realized(case, hours, ratio, n) -> None:  # type: ignore[no-untyped-def]
    r = running(1, 1, alloc={"od-0": 8}, started=0.0)
    s = snap([rented("od", "on_demand", 4.0, nodes=1), pool("prem", nodes=1)], [r], now=2 * HOUR,
             min_run_s=300.0)
    got = rebalance(s, plan(s), {1: facts("od", hours)}, RebalanceConfig(realized_move=ratio))
    assert len(got) == n
    if got:  # the move keeps its uncorrected estimate, to be compared with what it realizes
        plain = rebalance(s, plan(s), {1: facts("od", hours)})
        assert got[0].saving_usd == pytest.approx(plain[0].saving_usd)


@pytest.mark.parametrize(("ratio", "n"), [(1.0, 2), (0.0, 0)])
def test_defrag_is_corrected_by_what_past_defrag_moves_realized(ratio: float, n: int) -> None:
    rs = scattered()
    gang = job(9, gpus=2, nodes=2, submit=0.0)
    s = snap([pool("a", nodes=4, gpus=2)], rs, [gang], now=2 * HOUR, min_run_s=0)
    got = defrag(s, plan(s), {r.attempt_id: facts("a") for r in rs}, RebalanceConfig(realized_defrag=ratio))
    assert len(got) == n

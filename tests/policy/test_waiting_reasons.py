"""broker.policy.waiting.rest_reasons: the reasons of the jobs plan() did not reach, per run of
like jobs (one pool check per kind of job), sorted by job id."""

from __future__ import annotations

import pytest

from broker.policy import PendingView
from broker.policy.waiting import rest_reasons
from broker.spec import Priority, SpotPolicy


def job(jid: int, g: int = 1, types: tuple[str, ...] = (), spot: SpotPolicy = SpotPolicy.ALLOWED,
        prio: Priority = Priority.NORMAL, team: str = "a") -> PendingView:
    return PendingView(jid, team, prio, g, float(jid), gpu_types=types, spot=spot)


V100_ONLY = ("V100",)  # no pool has them in these tests


@pytest.mark.parametrize(("runs", "want", "checks"), [
    ([([job(3), job(1), job(2)], None)], [(1, "end"), (2, "end"), (3, "end")], 1),
    ([([job(2), job(1)], "dropped")], [(1, "dropped"), (2, "dropped")], 1),
    ([([job(1, types=V100_ONLY), job(2, types=V100_ONLY)], "dropped")], [(1, "none"), (2, "none")], 1),
    ([([job(1), job(2, types=V100_ONLY), job(3)], None)], [(1, "end"), (2, "none"), (3, "end")], 2),
    ([([job(5, g=2)], "x"), ([job(4, g=2), job(1, prio=Priority.LOW)], None), ([], None)],
     [(1, "end"), (4, "end"), (5, "x")], 2),
    ([([job(1, spot=SpotPolicy.NEVER), job(2)], None)], [(1, "end"), (2, "end")], 2),
])
def test_rest_reasons(runs: list[tuple[list[PendingView], str | None]], want: list[tuple[int, str]],
                      checks: int) -> None:
    asked: list[int] = []

    def has_pool(j: PendingView) -> bool:
        asked.append(j.job_id)
        return j.gpu_types != V100_ONLY

    assert rest_reasons([(jobs, why, False) for jobs, why in runs], "end", "none", has_pool) == want
    assert len(asked) == checks  # once per kind of job
    if all(len({(j.team, j.priority, j.gpus_per_node, j.nodes) for j in jobs}) <= 1 for jobs, _ in runs):
        asked.clear()  # runs of one list each: the same answers
        assert rest_reasons([(jobs, why, True) for jobs, why in runs], "end", "none", has_pool) == want
        assert len(asked) == checks

"""Quotas in the live engine (issue 28): the applied onepool.yaml's quotas reach plan(), and
a job within its team's quota reclaims another team's borrowed GPUs (real processes, fake
clock). One case: the rules themselves are tested as a table in tests/policy/test_quota.py."""

from __future__ import annotations

from tests.conftest import drive, train


def test_owner_reclaims_its_quota_from_a_borrower(make_cluster):
    c, eng = make_cluster(teams=[{"name": "research", "quota": {"gpus": 2}}, {"name": "prod"}])
    borrower = c.submit(name="borrower", team="prod", command=train(400), gpus_per_node=2,
                        priority="low").id
    drive(eng, lambda: c.get(borrower).status == "RUNNING")
    owner = c.submit(name="owner", team="research", command=train(4), gpus_per_node=2,
                     priority="low").id  # the same class: only the quota lets it preempt
    drive(eng, lambda: c.get(owner).status == "SUCCEEDED")
    first = c.get(borrower).attempt_list[0]
    assert first.end_reason == "PREEMPTED" and first.preempted_by == owner

"""Retention: keep the newest K committed checkpoints per job, delete the rest and abandoned
uploads after a safety delay on the broker's clock."""

from __future__ import annotations

import pytest
from sqlmodel import select

from broker.checkpoint.checkpoints import CheckpointStore
from broker.control.retention import Item, due
from broker.state.model import Checkpoint
from tests.conftest import drive, train

pytestmark = pytest.mark.both_dbs

S, T = "file:///s", "s3://t"  # two stores


def it(id_: int, step: int, state: str = "committed", seen: float = 0.0, store: str = S,
       job: int = 1) -> Item:
    return Item(id_, job, store, step, state, seen)


COMMITS = [it(1, 1, seen=10), it(2, 2, seen=20), it(3, 3, seen=30)]


@pytest.mark.parametrize(("items", "kw", "expected"), [
    # keep 2 of 3: step 1 fell out when step 3 was seen (t=30); delay 100.
    (COMMITS, {"now": 129}, []),
    (COMMITS, {"now": 130}, [1]),
    (COMMITS, {"now": 500, "keep": 3}, []),
    (COMMITS, {"now": 500, "protected": {(1, 1)}}, []),  # a running attempt restored from it
    # keep 1: step 1 fell out at t=20 (step 2 seen), step 2 at t=30.
    (COMMITS, {"now": 125, "keep": 1}, [1]),
    (COMMITS, {"now": 130, "keep": 1}, [1, 2]),
    # a copy of step 1 in another store goes with it
    ([*COMMITS, it(4, 1, seen=40, store=T)], {"now": 130}, [1, 4]),
    # damaged steps do not count among the kept; older damaged ones go, newer ones stay
    ([*COMMITS, it(5, 4, "damaged", seen=40), it(6, 0, "damaged", seen=5)], {"now": 130}, [1, 6]),
    # jobs are independent
    ([*COMMITS, it(7, 9, seen=1, job=2)], {"now": 130}, [1]),
    # an abandoned upload: seen without a manifest for the delay, nobody writing there
    ([it(8, 5, "partial", seen=10)], {"now": 109}, []),
    ([it(8, 5, "partial", seen=10)], {"now": 110}, [8]),
    ([it(8, 5, "partial", seen=10)], {"now": 500, "writing": {(1, S)}}, []),  # may be in flight
    ([it(8, 5, "partial", seen=10), it(9, 6, seen=20)], {"now": 110, "writing": {(1, S)}}, [8]),
    ([it(8, 5, "partial", seen=10), it(9, 6, seen=20, store=T)], {"now": 110, "writing": {(1, S)}}, []),
])
def test_due(items: list[Item], kw: dict, expected: list[int]) -> None:
    args = {"keep": 2, "delay_s": 100.0, **kw}
    assert sorted(i.id for i in due(items, **args)) == expected


def test_engine_deletes_old_checkpoints_and_abandoned_uploads_after_the_delay(make_cluster, clock):
    c, eng = make_cluster(keep_checkpoints=2, checkpoint_delete_delay_s=100)
    j = c.submit(name="r", team="research", command=train(12, 0.02, 2), gpus_per_node=1).id
    drive(eng, lambda: c.get(j).last_step is not None)
    st = CheckpointStore(c.get(j).checkpoint_uri)
    st.fs.makedirs(st.step_path(1000), exist_ok=True)
    st.fs.pipe_file(st.step_path(1000, "arrays.npz"), b"torn")  # an upload cut off
    drive(eng, lambda: c.get(j).status == "SUCCEEDED")
    assert [m.step for m in st.committed()] == [11, 9, 7, 5, 3, 1]
    clock.advance(99)
    eng.cycle()
    assert st.steps() == [1, 3, 5, 7, 9, 11, 1000]  # still inside the safety delay
    clock.advance(1)
    eng.cycle()
    assert st.steps() == [9, 11]
    with c.store.session() as s:
        states = {r.step: r.state for r in s.exec(select(Checkpoint).where(Checkpoint.job_id == j))}
    assert states == {1: "deleted", 3: "deleted", 5: "deleted", 7: "deleted", 9: "committed",
                      11: "committed", 1000: "abandoned"}
    ev = [e for e in c.events(j) if e.kind == "checkpoint_retention"]
    assert len(ev) == 1 and ev[0].data == {"deleted_steps": [1, 3, 5, 7], "abandoned_steps": [1000]}
    assert c.get(j).checkpoint_stores == [c.checkpoint_root(c.config())]  # deleted ones did live there

"""Group commit of submits (broker/api/batcher.py): one batch, one transaction; each submit
gets its own answer, a refused one leaves the others alone, and a key used twice in one
batch makes one job. The batch is handed to the batcher directly, so its make-up is exact."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from broker.api.app import create_app
from broker.api.batcher import _Submit
from broker.api.context import ApiContext, verify
from broker.checkpoint.checkpoints import job_prefix
from broker.checkpoint.index import default_store_root
from broker.client.sdk import Client
from broker.errors import Forbidden, SpecError, Unauthorized
from broker.state.model import Event, Job
from broker.state.tokens import NotVerifiedHere
from broker.state.views import JobInfo
from tests.api.conftest import Api, store_argon2_hash

JOB = {"name": "j", "command": ["true"], "gpus_per_node": 1}


def run_batch(api: Api, items: list[tuple[str | None, Any, str | None]]) -> list[JobInfo | BaseException]:
    """Commit `items` ((token, body, Idempotency-Key)) as one batch; each one's answer."""
    ctx: ApiContext = api.app.state.ctx
    loop = asyncio.new_event_loop()
    try:
        subs = [_Submit(token, body, key, loop, loop.create_future()) for token, body, key in items]
        answers: dict[int, JobInfo | BaseException] = {}
        ctx.batcher._commit(subs, lambda item, result: answers.setdefault(id(item), result))
        return [answers[id(s)] for s in subs]
    finally:
        loop.close()


def test_one_batch_answers_each_submit_and_commits_the_accepted_ones(api: Api):
    ctx: ApiContext = api.app.state.ctx
    verify(ctx, api.research)
    verify(ctx, api.prod)
    out = run_batch(api, [
        (api.research, JOB, "a"),
        (api.research, {**JOB, "gpu_types": ["H100"]}, None),  # no pool has it: refused
        (api.research, JOB, "a"),  # the same key and spec in the same batch: the same job
        (api.research, {**JOB, "name": "other"}, "a"),  # the same key, another spec: refused
        (api.prod, JOB, "a"),  # another token's key: another job
        (api.research, {**JOB, "team": "prod"}, None),  # a member submits for its team only
        (api.research, [1], None),  # not a job object
        ("op_000000000000_" + "x" * 43, JOB, None),  # unknown token
        (None, JOB, None),
    ])
    first, gpu, again, other, prod, team, bad, unknown, missing = out
    assert isinstance(first, JobInfo) and isinstance(again, JobInfo) and isinstance(prod, JobInfo)
    assert again.id == first.id and prod.id != first.id and prod.team == "prod"
    assert isinstance(gpu, SpecError) and "gpu_types" in str(gpu)
    assert isinstance(other, SpecError) and "already used for a different job" in str(other)
    assert isinstance(team, Forbidden)
    assert isinstance(bad, SpecError) and "must be a JSON object" in str(bad)
    assert isinstance(unknown, Unauthorized) and isinstance(missing, Unauthorized)
    with api.local.store.session() as s:
        jobs = s.exec(select(Job)).all()
        assert sorted(j.id for j in jobs) == sorted([first.id, prod.id])
        root = default_store_root(api.local.config(), api.local.store.home)
        assert [j.checkpoint_uri for j in jobs] == [job_prefix(root, j.team, j.experiment, j.id or 0)
                                                    for j in jobs]
        submitted = s.exec(select(Event).where(Event.kind == "submitted")).all()
        assert {(e.job_id, e.actor) for e in submitted} == {
            (first.id, f"token:{api.research.split('_')[1]} (research member)"),
            (prod.id, f"token:{api.prod.split('_')[1]} (prod member)")}
    # A key committed by an earlier batch replays its job, in a later batch.
    (replay,) = run_batch(api, [(api.research, JOB, "a")])
    assert isinstance(replay, JobInfo) and replay.id == first.id


def test_a_token_with_an_old_slow_hash_goes_back_to_the_route(api: Api):
    """The batch never runs the slow (argon2) hash of a row written before the fast one: the
    route verifies the token off the loop, which upgrades the row, and submits again (over
    HTTP the client sees one 201); the next batch checks it itself."""
    store_argon2_hash(api, api.research)
    (out,) = run_batch(api, [(api.research, JOB, None)])
    assert isinstance(out, NotVerifiedHere)
    r = api.http.post("/v1/jobs", json=JOB, headers=api.as_(api.research))
    assert r.status_code == 201, r.text
    assert isinstance(run_batch(api, [(api.research, JOB, None)])[0], JobInfo)


def test_a_revoked_token_is_refused_by_the_next_batch(api: Api):
    verify(api.app.state.ctx, api.research)
    assert isinstance(run_batch(api, [(api.research, JOB, None)])[0], JobInfo)
    tid = api.research.split("_")[1]
    api.local.revoke_token(tid)
    (out,) = run_batch(api, [(api.research, JOB, None)])
    assert isinstance(out, Unauthorized) and "revoked" in str(out)


@pytest.mark.parametrize("key", ["", "k" * 201])
def test_a_bad_idempotency_key_is_refused_alone(api: Api, key: str):
    verify(api.app.state.ctx, api.research)
    bad, good = run_batch(api, [(api.research, JOB, key), (api.research, JOB, None)])
    assert isinstance(bad, SpecError) and "Idempotency-Key" in str(bad)
    assert isinstance(good, JobInfo)


@pytest.mark.parametrize("alone", [False, True], ids=["with-another-submit", "alone"])
def test_a_batch_whose_commit_fails_is_retried_one_submit_at_a_time(api: Api, monkeypatch, alone: bool):
    """Another API process commits the same Idempotency-Key between this batch's read and its
    write: the batch's commit fails, and each submit is tried again alone. The keyed one
    replays the other process's job, the rest are written: nobody hears the other's error.
    A batch of the keyed submit alone is tried again too (it answered 500 before)."""
    from broker.client import submits

    ctx: ApiContext = api.app.state.ctx
    verify(ctx, api.research)
    read, raced = submits.SubmitBatch.read.__func__, []  # type: ignore[attr-defined]

    def read_then_race(cls, s, keys):  # type: ignore[no-untyped-def]
        out = read(cls, s, keys)
        if not raced:  # the other process, in its own transaction, between read and write
            raced.append(None)
            raced[0] = run_batch(api, [(api.research, JOB, "race")])[0]
        return out

    monkeypatch.setattr(submits.SubmitBatch, "read", classmethod(read_then_race))
    loop = asyncio.new_event_loop()
    try:
        items = [(JOB, "race")] if alone else [(JOB, "race"), ({**JOB, "name": "other"}, None)]
        subs = [_Submit(api.research, body, key, loop, loop.create_future()) for body, key in items]
        ctx.batcher._handle(subs)
        got = loop.run_until_complete(asyncio.gather(*(x.fut for x in subs), return_exceptions=True))
    finally:
        loop.close()
    (theirs,) = raced
    assert all(isinstance(x, JobInfo) for x in [theirs, *got]), got
    assert got[0].id == theirs.id
    if not alone:
        assert got[1].id != theirs.id and got[1].name == "other"
    with api.local.store.session() as s:
        assert sorted(j.name for j in s.exec(select(Job)).all()) == ["j"] if alone else ["j", "other"]


@pytest.mark.both_dbs
def test_one_key_raced_across_two_api_processes_answers_one_job_to_both(api: Api) -> None:
    """Two API apps on the same database (each its own Store, batcher and verifier: two
    processes as far as the database can tell) get the same Idempotency-Key at once, key after
    key: both answer 201 with the same job, and one job per key is stored."""
    second = create_app(Client(api.local.store.home, clock=api.clock).store, api.clock)
    keys = [f"k{i}" for i in range(24)]
    with TestClient(second) as http2, ThreadPoolExecutor(2) as pool:
        clients = (api.http, http2)
        for c in clients:  # each process verifies the token once (off the race)
            assert c.post("/v1/jobs", json=JOB, headers=api.as_(api.research)).status_code == 201
        for key in keys:
            gate = threading.Barrier(2)

            def post(c: TestClient, key: str = key, gate: threading.Barrier = gate) -> Any:
                gate.wait()
                return c.post("/v1/jobs", json=JOB, headers={**api.as_(api.research), "Idempotency-Key": key})

            a, b = pool.map(post, clients)
            assert (a.status_code, b.status_code) == (201, 201), (key, a.text, b.text)
            assert a.json()["id"] == b.json()["id"]
    with api.local.store.session() as s:
        assert len(s.exec(select(Job)).all()) == 2 + len(keys)

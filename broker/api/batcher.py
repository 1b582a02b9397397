"""Group commit for submits: concurrent POST /v1/jobs share one transaction, so one commit
(one fsync: milliseconds on a real disk, where SQLite's synchronous=FULL waits for it) serves
the whole batch instead of each. Durability is unchanged: a submit is answered only after the
commit that holds it.

One thread does every submit's database work, batch after batch, and answers the event loop
that waits for it (the route is async: no worker thread per request). Per batch, in one
session: the applied config is read once and each distinct token once (its row, so a
revocation is seen at once; its hash only if this process verified it before: a token never
seen goes back to the route, which verifies it in the thread pool, so the slow hash never
stalls the batch). Each submit's checks (token, spec, team, fit, budget, idempotency key) run
before anything is written, so a refused submit leaves the batch as it found it; then the
accepted ones are written together (one INSERT of their jobs, one of their events, one of
their keys) and committed. A failed commit fails every submit of the batch (their
Idempotency-Keys make the client's retry safe).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session

from broker.client.sdk import Client
from broker.client.submits import StagedSubmit, SubmitBatch, write_submits
from broker.errors import NotConfigured, OnepoolError, SpecError
from broker.spec import JobSpec
from broker.state.store import Store
from broker.state.tokens import NotVerifiedHere, Principal, Verifier
from broker.state.views import JobInfo

log = logging.getLogger("onepool.api")


@dataclass
class _Submit:
    token: str | None
    body: Any
    key: str | None
    loop: asyncio.AbstractEventLoop
    fut: asyncio.Future[JobInfo]



Answer = tuple[asyncio.Future[JobInfo], "JobInfo | BaseException"]


def _settle(answers: list[Answer]) -> None:
    for fut, result in answers:
        if fut.done():  # the request went away (client disconnected)
            continue
        if isinstance(result, BaseException):
            fut.set_exception(result)
        else:
            fut.set_result(result)


class _Answers:
    """A batch's answers, handed to each event loop in one wake-up (not one per submit)."""

    def __init__(self) -> None:
        self.by_loop: dict[asyncio.AbstractEventLoop, list[Answer]] = {}
        self.answered: set[int] = set()

    def add(self, item: _Submit, result: JobInfo | BaseException) -> None:
        self.answered.add(id(item))
        self.by_loop.setdefault(item.loop, []).append((item.fut, result))

    def has(self, item: _Submit) -> bool:
        return id(item) in self.answered

    def send(self) -> None:
        for loop, answers in self.by_loop.items():
            loop.call_soon_threadsafe(_settle, answers)


class SubmitBatcher:
    def __init__(self, store: Store, verifier: Verifier, client: Callable[[Principal], Client],
                 max_batch: int = 128) -> None:
        self.store, self.verifier, self.client, self.max_batch = store, verifier, client, max_batch
        self._q: queue.Queue[_Submit] = queue.Queue()
        threading.Thread(target=self._run, name="submit-batcher", daemon=True).start()

    async def submit(self, token: str | None, body: Any, key: str | None) -> JobInfo:
        """Submit `body` (a job spec) as the holder of `token`, answered once the commit that
        holds it is done. Raises what Client.submit raises, Unauthorized, and NotVerifiedHere
        for a token this process has not verified yet (verify it, then submit again)."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[JobInfo] = loop.create_future()
        self._q.put(_Submit(token, body, key, loop, fut))
        return await fut

    def _run(self) -> None:
        while True:
            batch = [self._q.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            self._handle(batch)

    def _handle(self, batch: list[_Submit]) -> None:
        """Commit a batch and answer every submit in it. If the commit fails (a key another
        API process committed a moment ago, a lock timeout), one submit must not sink the
        others: each one not yet answered is tried again alone, and only a submit that fails
        alone hears its own error. A lone submit whose key was raced is tried again too: it
        then replays the other process's job."""
        answers = _Answers()
        failed = self._commit(batch, answers.add)
        if failed is not None:
            for item in [b for b in batch if not answers.has(b)]:
                raced = isinstance(failed, IntegrityError)
                alone = failed if len(batch) == 1 and not raced else self._alone(item, answers.add)
                if alone is not None:
                    answers.add(item, alone)
        answers.send()

    def _alone(self, item: _Submit,
               answer: Callable[[_Submit, JobInfo | BaseException], None]) -> Exception | None:
        """Commit one submit by itself. A unique-constraint failure means another API process
        committed the same Idempotency-Key since this one read the keys: the next try reads
        that key and answers its job (as a retry would), so a raced key never answers 500."""
        for _ in range(3):
            failed = self._commit([item], answer)
            if not isinstance(failed, IntegrityError):
                return failed
        return failed

    def _principal(self, s: Session, token: str | None,
                   seen: dict[str | None, Principal | Exception]) -> Principal:
        if token not in seen:
            try:
                seen[token] = self.verifier.api_principal(s, token, cached_only=True)
            except (OnepoolError, NotVerifiedHere) as e:  # the answer to each submit with this token
                seen[token] = e
        got = seen[token]
        if isinstance(got, Exception):
            raise got
        return got

    def _commit(self, batch: list[_Submit],
                answer: Callable[[_Submit, JobInfo | BaseException], None]) -> Exception | None:
        """Verify, check, write and commit a batch, calling answer(item, JobInfo or error) for
        each refused submit (its own error) and, once committed, for each written one. If the
        commit fails, nothing is written, the written ones are not answered, and the error is
        returned (the caller retries them alone)."""
        staged: list[tuple[_Submit, StagedSubmit]] = []
        try:
            with self.store.session() as s:
                principals: dict[str | None, Principal | Exception] = {}
                ready: list[tuple[_Submit, Client, JobSpec]] = []
                for item in batch:
                    try:
                        client = self.client(self._principal(s, item.token, principals))
                        if not isinstance(item.body, dict):
                            raise SpecError("job", ["(root): must be a JSON object of job fields"])
                        ready.append((item, client, client.prepare(item.body)))
                    except (OnepoolError, ValueError, NotVerifiedHere) as e:  # this submit's answer
                        answer(item, e)
                if not ready:
                    return None
                try:
                    shared = SubmitBatch.read(s, [(c.principal, item.key) for item, c, _ in ready])
                except NotConfigured as e:
                    for item, _, _ in ready:
                        answer(item, e)
                    return None
                for item, client, js in ready:
                    try:
                        staged.append((item, client.stage_submit(s, shared, js, item.key)))
                    except (OnepoolError, ValueError) as e:  # this submit's answer
                        answer(item, e)
                infos = write_submits(s, [st for _, st in staged]) if staged else []
        except Exception as e:  # noqa: BLE001  (the commit failed: returned, the caller decides)
            log.warning("a batch of %d submits failed to commit: %s", len(staged), e)
            return e
        if infos:
            self.store.changed()  # wake the broker: the next cycle places them (issue 27)
        for (item, _), info in zip(staged, infos, strict=True):
            answer(item, info)
        return None

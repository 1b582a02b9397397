"""Group commit for submits: concurrent POST /v1/jobs share one transaction, so one commit
(one fsync: milliseconds on a real disk, where SQLite's synchronous=FULL waits for it) serves
the whole batch instead of each. Durability is unchanged: a submit is answered only after the
commit that holds it.

Each submit's checks (spec, team, fit, budget, idempotency key) run before it writes anything,
so a refused submit leaves the batch's transaction as it found it; a failed commit fails every
submit of the batch (their Idempotency-Keys make the client's retry safe).
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from broker.client.sdk import Client
from broker.errors import OnepoolError
from broker.spec import JobSpec
from broker.state.events import acting_as
from broker.state.store import Store
from broker.state.views import JobInfo

log = logging.getLogger("onepool.api")
Item = tuple[Client, JobSpec, "str | None", "Future[JobInfo]"]


class SubmitBatcher:
    def __init__(self, store: Store, max_batch: int = 128) -> None:
        self.store, self.max_batch = store, max_batch
        self._q: queue.Queue[Item] = queue.Queue()
        threading.Thread(target=self._run, name="submit-batcher", daemon=True).start()

    def submit(self, client: Client, js: JobSpec, key: str | None) -> JobInfo:
        """Queue the submit and wait for the commit that holds it. Raises what submit() raises."""
        fut: Future[JobInfo] = Future()
        self._q.put((client, js, key, fut))
        return fut.result()

    def _run(self) -> None:
        while True:
            batch = [self._q.get()]
            while len(batch) < self.max_batch:
                try:
                    batch.append(self._q.get_nowait())
                except queue.Empty:
                    break
            self._commit(batch)

    def _commit(self, batch: list[Item]) -> None:
        done: list[tuple[Future[JobInfo], JobInfo]] = []
        try:
            with self.store.session() as s:
                for client, js, key, fut in batch:
                    try:
                        with acting_as(client.principal.actor):
                            done.append((fut, client.submit_in(s, js, key)))
                    except (OnepoolError, ValueError) as e:
                        fut.set_exception(e)
        except Exception as e:  # noqa: BLE001  (the commit failed: every waiting submit hears why)
            log.warning("a batch of %d submits failed to commit: %s", len(done), e)
            for fut, _ in done:
                fut.set_exception(e)
            return
        for fut, info in done:
            fut.set_result(info)

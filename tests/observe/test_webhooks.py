"""Webhooks (broker.control.notify): a receiver on loopback that is down for a while gets each
notification exactly once after it comes back (idempotency key, retries with backoff on the
injected clock), signed with the team's secret; the URL appears in no log line or row."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select

from broker.client.sdk import Client
from broker.clock import FakeClock
from broker.control.notify import Notifier, backoff_s
from broker.errors import SpecError
from broker.spec import parse_config
from broker.state.events import record
from broker.state.model import Job, WebhookDelivery
from tests.conftest import config

SECRET = "s3cret-s3cret-s3cret"


@dataclass
class Receiver:
    """A webhook endpoint: answers 503 while `down`, else 200; keeps what it accepted by key
    (a second delivery of a key is answered 200 and counted as a duplicate)."""

    down: bool = True
    accepted: dict[str, dict[str, Any]] = field(default_factory=dict)
    duplicates: int = 0
    refused: int = 0
    url: str = ""

    def start(self) -> ThreadingHTTPServer:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.down:
                    outer.refused += 1
                    self.send_response(503)
                else:
                    key = self.headers["Idempotency-Key"]
                    if key in outer.accepted:
                        outer.duplicates += 1
                    else:
                        outer.accepted[key] = {"body": body, "ts": self.headers["X-Onepool-Timestamp"],
                                               "sig": self.headers["X-Onepool-Signature"]}
                    self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{httpd.server_address[1]}/hooks/T0KEN-in-the-path"
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    httpd = r.start()
    yield r
    httpd.shutdown()


def site(tmp_path: Path, clock: FakeClock, url: str) -> Client:
    c = Client(tmp_path / "home", clock=clock)
    c.apply(parse_config(config(teams=[{"name": "research", "webhook_url": url, "webhook_secret": SECRET},
                                       {"name": "prod"}])))
    return c


def events(c: Client, clock: FakeClock) -> dict[str, int]:
    """A job of research that is preempted and then fails, research's budget running low, and a
    job of prod (no webhook) that succeeds, and an event kind nobody is notified of."""
    with c.store.session() as s:
        jobs = [Job(name=n, team=t, submit_time=0.0, queued_at=0.0) for n, t in (("bert", "research"),
                                                                                 ("gpt", "prod"))]
        for j in jobs:
            s.add(j)
        s.flush()
        made = {
            "preempted": record(s, clock.now(), "preempted", "preempted for job 9", job_id=jobs[0].id),
            "failed": record(s, clock.now(), "failed", "attempt 2 ended: FAILED (exit code 1)",
                             job_id=jobs[0].id),
            "team_budget_low": record(s, clock.now(), "team_budget_low", "team research has spent $80",
                                      team="research")}
        record(s, clock.now(), "succeeded", "attempt 1 ended: COMPLETED", job_id=jobs[1].id)
        record(s, clock.now(), "started", "on a100-0", job_id=jobs[0].id)
        s.commit()
        return {k: int(e.id or 0) for k, e in made.items()}


@pytest.mark.both_dbs
def test_each_notification_arrives_exactly_once_after_an_outage(tmp_path: Path, clock: FakeClock,
                                                                 receiver: Receiver, caplog):
    c = site(tmp_path, clock, receiver.url)
    n = Notifier(c.store, clock)
    assert n.step() == 0  # the cursor starts at the newest event: history is not replayed
    ids = events(c, clock)
    caplog.set_level(logging.DEBUG)
    assert n.step() == 0 and receiver.refused == 3  # down: every try refused
    assert n.step() == 0 and receiver.refused == 3  # not due again before its backoff
    clock.advance(backoff_s(1))
    assert n.step() == 0 and receiver.refused == 6
    receiver.down = False
    clock.advance(backoff_s(2) - 1)
    assert n.step() == 0  # still backing off
    clock.advance(1)
    assert n.step() == 3
    clock.advance(3600)
    assert n.step() == 0  # delivered ones are never sent again
    assert receiver.duplicates == 0
    assert sorted(receiver.accepted) == sorted(f"onepool-event-{i}" for i in ids.values())
    for key, got in receiver.accepted.items():
        body = json.loads(got["body"])
        expected = "sha256=" + hmac.new(SECRET.encode(), got["ts"].encode() + b"." + got["body"],
                                        hashlib.sha256).hexdigest()
        assert hmac.compare_digest(got["sig"], expected)
        assert body["onepool"]["key"] == key and body["onepool"]["team"] == "research"
        assert body["text"].startswith("onepool: ")
    kinds = {json.loads(g["body"])["onepool"]["kind"] for g in receiver.accepted.values()}
    assert kinds == {"preempted", "failed", "team_budget_low"}
    with c.store.session() as s:
        rows = s.exec(select(WebhookDelivery)).all()
        assert {(r.attempts, r.last_error) for r in rows} == {(2, "HTTP 503")}
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "HTTP 503" in logged and "T0KEN" not in logged  # httpx logs every URL at INFO: filtered


@pytest.mark.parametrize(("url", "error"), [
    ("http://127.0.0.1:9/hooks/T0KEN", "ConnectError"),  # nothing listens on port 9
    ("http://[::1/hooks/T0KEN", "InvalidURL"),  # passes the config's check, not httpx's
])
def test_a_failed_send_is_retried_and_never_names_the_url(tmp_path: Path, clock: FakeClock, caplog,
                                                          url: str, error: str):
    c = site(tmp_path, clock, url)
    n = Notifier(c.store, clock)
    n.step()
    events(c, clock)
    caplog.set_level(logging.DEBUG)
    assert n.step() == 0
    with c.store.session() as s:
        rows = s.exec(select(WebhookDelivery)).all()
    assert len(rows) == 3 and all(r.attempts == 1 and r.last_error == error for r in rows)
    assert all(r.next_at == clock.now() + backoff_s(1) for r in rows)
    assert "T0KEN" not in " ".join(r.getMessage() for r in caplog.records)


@pytest.mark.parametrize(("team", "problem"), [
    ({"webhook_url": "https://hooks.example/x"}, "webhook_secret: required with webhook_url"),
    ({"webhook_url": "ftp://hooks.example/T0KEN", "webhook_secret": SECRET},
     "webhook_url: must be an http:// or https:// URL"),
    ({"webhook_url": "https://hooks.example/x", "webhook_secret": "T0KEN"}, "webhook_secret: String should"),
])
def test_bad_webhook_settings_name_the_field_and_never_echo_the_secret(team: dict, problem: str):
    with pytest.raises(SpecError) as e:
        parse_config(config(teams=[{"name": "research", **team}]))
    assert problem in str(e.value) and "T0KEN" not in str(e.value)


def test_a_job_with_its_own_webhook_hears_of_itself_and_its_team_of_everything(tmp_path: Path,
                                                                               clock: FakeClock):
    team_hook, job_hook = Receiver(down=False), Receiver(down=False)
    servers = [team_hook.start(), job_hook.start()]
    try:
        c = site(tmp_path, clock, team_hook.url)
        n = Notifier(c.store, clock)
        n.step()
        own = f"{job_hook.url}/own-T0KEN"
        j = c.submit(name="bert", team="research", command=["true"], webhook_url=own,
                     webhook_secret="job-secret-job-secret")
        assert "T0KEN" not in json.dumps(c.get(j.id).model_dump())  # never in a view
        with c.store.session() as s:
            record(s, clock.now(), "preempted", "preempted for job 9", job_id=j.id)
            record(s, clock.now(), "team_budget_low", "team research has spent $80", team="research")
            s.commit()
        assert n.step() == 3
        assert len(team_hook.accepted) == 2 and len(job_hook.accepted) == 1
        [got] = job_hook.accepted.values()
        assert json.loads(got["body"])["onepool"]["kind"] == "preempted"
        assert got["sig"] == "sha256=" + hmac.new(b"job-secret-job-secret", got["ts"].encode() + b"."
                                                  + got["body"], hashlib.sha256).hexdigest()
    finally:
        for srv in servers:
            srv.shutdown()


@pytest.mark.parametrize(("attempts", "wait"), [(1, 2.0), (2, 4.0), (5, 32.0), (30, 600.0)])
def test_backoff_doubles_up_to_ten_minutes(attempts: int, wait: float):
    assert backoff_s(attempts) == wait


@pytest.mark.e2e
def test_the_leader_sends_from_its_own_thread_and_a_stuck_receiver_never_stalls_the_cycle(tmp_path: Path):
    """The broker loop (service.run) leads; the receiver holds every request until released.
    Meanwhile a job runs and succeeds (the cycle goes on); once released, the notification of its
    end arrives, once."""
    from broker.clock import SystemClock
    from broker.control import service
    from tests.conftest import kill_leftovers, train

    release, asked = threading.Event(), threading.Event()
    got: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            asked.set()
            ok = release.wait(4.0)  # the notifier's own timeout is 5 s
            if ok:
                got.append(body)
            self.send_response(200 if ok else 503)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    clock = SystemClock()
    c = site(tmp_path, clock, f"http://127.0.0.1:{httpd.server_address[1]}/hook")  # type: ignore[arg-type]
    Notifier(c.store, clock).step()  # webhooks start here (the cursor), not at the loop's first round
    stop = threading.Event()
    loop = threading.Thread(target=service.run, args=(c.store, clock), kwargs={"stop": stop, "cycle_s": 0.1},
                            daemon=True)
    loop.start()
    try:
        first = c.submit(name="first", team="research", command=train(2), gpus_per_node=1).id
        _wait(lambda: c.get(first).status == "SUCCEEDED")
        _wait(asked.is_set)  # the notifier now waits on the receiver
        second = c.submit(name="second", team="research", command=train(2), gpus_per_node=1).id
        _wait(lambda: c.get(second).status == "SUCCEEDED")  # ...and the cycle went on
        release.set()
        _wait(lambda: len(got) >= 2)
        keys = [json.loads(b)["onepool"]["key"] for b in got]
        assert len(keys) == len(set(keys)) == 2
        assert {json.loads(b)["onepool"]["job"] for b in got} == {first, second}
    finally:
        stop.set()
        release.set()
        loop.join(timeout=30)
        httpd.shutdown()
        kill_leftovers(tmp_path / "home" / "runs")


def _wait(cond: Any, timeout: float = 60.0) -> None:
    from tests.agents.harness import wait_for

    wait_for("condition", cond, timeout=timeout)

"""Notifications to teams' webhooks (issue 30): Slack-compatible JSON, signed, delivered at
least once with backoff, never on the scheduling cycle's path.

A team with `webhook_url` and `webhook_secret` in onepool.yaml hears of its jobs ending
(succeeded, failed, cancelled, budget_exhausted), preempted and interrupted, and of its budget
running low or out; a job submitted with its own `webhook_url` and `webhook_secret` hears of
its own end, preemption and interruption. The source is the event log:

1. `enqueue` reads the events after a cursor (a Setting row; on first use the cursor starts at
   the newest event, so enabling webhooks does not replay history) and writes one
   WebhookDelivery row per event and target (`team:NAME`, `job:ID`), with the cursor, in one
   transaction: each event becomes at most one delivery per target, also across restarts.
2. `send_due` posts each undelivered row whose `next_at` has come: body
   `{"text": "...", "onepool": {...}}` (Slack shows `text`), headers `Idempotency-Key:
   onepool-event-ID` (the same on every retry: a receiver that saw it ignores it),
   `X-Onepool-Timestamp` and `X-Onepool-Signature: sha256=HEX`, the HMAC-SHA256 with the team's
   secret of `TIMESTAMP.BODY`. A 2xx marks it delivered; anything else (a status, a timeout, a
   refused connection) schedules the next try after 2, 4, 8 ... seconds, at most 10 minutes.
   A crash between a 2xx and its commit sends it again: at least once.

The leader runs `Notifier.run` in a thread of its own beside the cycle (broker.control.service).
The URL is a secret: no log line, error or row holds it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading

import httpx
from sqlalchemy import func
from sqlmodel import Session, col, select

from broker.clock import Clock
from broker.control.config_apply import applied_config
from broker.errors import NotConfigured
from broker.spec import TeamSpec
from broker.state.model import Event, Job, Setting, WebhookDelivery
from broker.state.store import Store

log = logging.getLogger("onepool.notify")
CURSOR = "webhooks:cursor"
KINDS = {"succeeded": "succeeded", "failed": "failed", "cancelled": "was cancelled",
         "budget_exhausted": "stopped: its budget is spent", "preempted": "was preempted",
         "interrupted": "was interrupted", "team_budget_low": "budget is running low",
         "team_budget_exhausted": "budget is spent"}
BASE_BACKOFF_S = 2.0
MAX_BACKOFF_S = 600.0
BATCH = 200


class _Secrets(logging.Filter):
    """Drops any record of the HTTP libraries that would show a webhook URL (httpx logs every
    request's URL at INFO). Installed once; the notifier registers the URLs it uses."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        return not any(u in msg for u in self.urls)


_SECRETS = _Secrets()
for _name in ("httpx", "httpcore"):
    logging.getLogger(_name).addFilter(_SECRETS)


def backoff_s(attempts: int) -> float:
    """Seconds before try number `attempts + 1` (after `attempts` failed tries)."""
    return min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2 ** max(0, attempts - 1))


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The X-Onepool-Signature header a receiver recomputes to check a delivery."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def _teams(s: Session) -> dict[str, TeamSpec]:
    try:
        teams = {t.name: t for t in applied_config(s).teams if t.webhook_url and t.webhook_secret}
    except NotConfigured:
        return {}
    _SECRETS.urls.update(t.webhook_url for t in teams.values() if t.webhook_url)
    return teams


def _hooks(s: Session, targets: list[str]) -> dict[str, tuple[str, str]]:
    """(URL, secret) of each target that has a webhook now (read at send time: a changed URL or
    secret applies to deliveries still due)."""
    teams = _teams(s)
    out = {f"team:{name}": (t.webhook_url, t.webhook_secret) for name, t in teams.items()
           if t.webhook_url and t.webhook_secret}
    ids = [int(x.removeprefix("job:")) for x in targets if x.startswith("job:")]
    for j in s.exec(select(Job).where(col(Job.id).in_(ids))) if ids else []:
        if j.webhook_url and j.webhook_secret:
            _SECRETS.urls.add(j.webhook_url)
            out[f"job:{j.id}"] = (j.webhook_url, j.webhook_secret)
    return out


def enqueue(s: Session, now: float) -> int:
    """Turn the events after the cursor into deliveries for teams with a webhook; advance the
    cursor. Returns how many deliveries it made. The caller commits."""
    row = s.get(Setting, CURSOR)
    if row is None:
        newest = s.exec(select(func.coalesce(func.max(Event.id), 0))).one()
        s.add(Setting(key=CURSOR, value={"event_id": int(newest)}))
        return 0
    teams = _teams(s)
    events = s.exec(select(Event).where(col(Event.id) > int(row.value["event_id"]))
                    .order_by(col(Event.id)).limit(BATCH)).all()
    if not events:
        return 0
    jobs = {j.id: j for j in s.exec(select(Job).where(
        col(Job.id).in_({e.job_id for e in events if e.job_id is not None})))}
    made = 0
    for e in events:
        job = jobs.get(e.job_id) if e.job_id is not None else None
        team = job.team if job is not None else e.data.get("team")
        targets = [f"team:{team}"] if team in teams else []
        if job is not None and job.webhook_url:
            targets.append(f"job:{job.id}")
        if e.kind not in KINDS or not targets:
            continue
        what = (f"job {job.id} ({job.name}) of team {team} {KINDS[e.kind]}" if job is not None
                else f"team {team}'s {KINDS[e.kind]}")
        payload = {"text": f"onepool: {what}: {e.message}",
                   "onepool": {"key": f"onepool-event-{e.id}", "event_id": e.id, "kind": e.kind,
                               "time": e.time, "team": team, "job": job.id if job else None,
                               "job_name": job.name if job else None, "message": e.message}}
        for target in targets:
            s.add(WebhookDelivery(target=target, team=str(team), event_id=e.id or 0, kind=e.kind,
                                  payload=payload, created_at=now, next_at=now))
            made += 1
    row.value = {"event_id": int(events[-1].id or 0)}
    s.add(row)
    return made


class Notifier:
    """Makes and sends deliveries (see the module's doc). `http` defaults to a client with a
    5 s timeout that follows no redirect."""

    def __init__(self, store: Store, clock: Clock, http: httpx.Client | None = None) -> None:
        self.store, self.clock = store, clock
        self.http = http or httpx.Client(timeout=5.0, follow_redirects=False)

    def step(self) -> int:
        """One round: enqueue new events, then send what is due. Returns deliveries made."""
        with self.store.session() as s:
            enqueue(s, self.clock.now())
            s.commit()
        return self.send_due()

    def send_due(self) -> int:
        now = self.clock.now()
        with self.store.session() as s:
            due = s.exec(select(WebhookDelivery).where(col(WebhookDelivery.delivered_at).is_(None),
                                                       WebhookDelivery.next_at <= now)
                         .order_by(col(WebhookDelivery.id)).limit(BATCH)).all()
            hooks = _hooks(s, [d.target for d in due])
            s.expunge_all()
        done = 0
        for d in due:
            hook = hooks.get(d.target)
            error = "no webhook there now" if hook is None else self._post(d, *hook)
            with self.store.session() as s:
                row = s.get(WebhookDelivery, d.id)
                if row is None or row.delivered_at is not None:
                    continue
                if error is None:
                    row.delivered_at, done = self.clock.now(), done + 1
                else:
                    row.attempts += 1
                    row.next_at = self.clock.now() + backoff_s(row.attempts)
                    row.last_error = error[:200]
                    log.warning("webhook delivery %s (event %s) to %s failed (%s); try %d in %.0fs",
                                row.id, row.event_id, row.target, row.last_error, row.attempts + 1,
                                row.next_at - self.clock.now())
                s.add(row)
                s.commit()
        return done

    def _post(self, d: WebhookDelivery, url: str, secret: str) -> str | None:
        """Send one delivery; None when a 2xx answered, else why not (never the URL)."""
        body = json.dumps(d.payload, sort_keys=True).encode()
        ts = f"{self.clock.now():.0f}"
        headers = {"Content-Type": "application/json", "Idempotency-Key": d.payload["onepool"]["key"],
                   "X-Onepool-Timestamp": ts, "X-Onepool-Signature": signature(secret, ts, body)}
        try:
            r = self.http.post(url, content=body, headers=headers)
        except (httpx.HTTPError, httpx.InvalidURL) as e:
            return type(e).__name__  # its text may hold the URL
        return None if 200 <= r.status_code < 300 else f"HTTP {r.status_code}"

    def run(self, stop: threading.Event, every_s: float = 1.0) -> None:
        """Step now and every `every_s` until `stop`: a failing round is logged and the loop
        goes on."""
        while not stop.is_set():
            try:
                self.step()
            except Exception:  # the loop must outlive any one round; logged with its traceback
                log.exception("webhook round failed; next round in %.0fs", every_s)
            stop.wait(every_s)

    def close(self) -> None:
        self.http.close()


__all__ = ["CURSOR", "KINDS", "Notifier", "backoff_s", "enqueue", "signature"]

"""Interruption notices from the cloud's instance metadata service.

- AWS (IMDSv2): a session token from PUT /latest/api/token, then
  /latest/meta-data/spot/instance-action (404 until a spot interruption is scheduled, then
  {"action": "terminate", "time": "...Z"}: about two minutes' notice) and
  /latest/meta-data/events/recommendations/rebalance (a rebalance recommendation).
- GCE: /computeMetadata/v1/instance/preempted ("TRUE" once preempted; about 30 s notice) and
  /computeMetadata/v1/instance/maintenance-event (TERMINATE_ON_HOST_MAINTENANCE).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import httpx

log = logging.getLogger("onepool.agent.metadata")
AWS_BASE = "http://169.254.169.254"
GCE_BASE = "http://metadata.google.internal"


@dataclass(frozen=True)
class Notice:
    kind: str  # spot_interruption | rebalance | preempted | maintenance
    deadline: float | None = None
    detail: str = ""


class Watcher(Protocol):
    def poll(self) -> list[Notice]: ...


class AwsImds:
    def __init__(self, base: str = AWS_BASE, http: httpx.Client | None = None) -> None:
        self.base = base.rstrip("/")
        self.http = http or httpx.Client(timeout=2.0)
        self._token: str | None = None

    def _get(self, path: str) -> httpx.Response:
        if self._token is None:
            r = self.http.put(f"{self.base}/latest/api/token",
                              headers={"X-aws-ec2-metadata-token-ttl-seconds": "21600"})
            r.raise_for_status()
            self._token = r.text
        r = self.http.get(f"{self.base}{path}", headers={"X-aws-ec2-metadata-token": self._token})
        if r.status_code == 401:  # the session token expired
            self._token = None
        return r

    def poll(self) -> list[Notice]:
        out = []
        r = self._get("/latest/meta-data/spot/instance-action")
        if r.status_code == 200:
            data = r.json()
            out.append(Notice("spot_interruption", _epoch(data.get("time")), str(data.get("action", ""))))
        r = self._get("/latest/meta-data/events/recommendations/rebalance")
        if r.status_code == 200:
            out.append(Notice("rebalance", None, r.text[:200]))
        return out


class GceMetadata:
    def __init__(self, base: str = GCE_BASE, http: httpx.Client | None = None) -> None:
        self.base = base.rstrip("/")
        self.http = http or httpx.Client(timeout=2.0, headers={"Metadata-Flavor": "Google"})

    def poll(self) -> list[Notice]:
        out = []
        h = {"Metadata-Flavor": "Google"}
        r = self.http.get(f"{self.base}/computeMetadata/v1/instance/preempted", headers=h)
        if r.status_code == 200 and r.text.strip().upper() == "TRUE":
            out.append(Notice("preempted"))
        r = self.http.get(f"{self.base}/computeMetadata/v1/instance/maintenance-event", headers=h)
        if r.status_code == 200 and r.text.strip().startswith("TERMINATE"):
            out.append(Notice("maintenance", None, r.text.strip()[:200]))
        return out


def _epoch(iso: str | None) -> float | None:
    if not iso:
        return None
    try:
        return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def watcher(kind: str, base: str | None) -> Watcher | None:
    """The watcher for `kind` (aws | gcp | none). Raises ValueError for another kind."""
    if kind == "aws":
        return AwsImds(base or AWS_BASE)
    if kind == "gcp":
        return GceMetadata(base or GCE_BASE)
    if kind == "none":
        return None
    raise ValueError(f"--metadata: must be one of aws, gcp, none (got {kind!r})")

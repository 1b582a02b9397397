"""The client of the CLI's HTTP fast path (broker.client.cli_fast): the SDK methods that
`onepool submit`, `status`, `cancel` and `events` call (broker.client.cli_jobs), answering
broker.wire_views views of the server's JSON instead of broker.wire's pydantic models (issue 27:
a CLI that starts fast).
Same requests, retries and errors as the SDK's HttpClient: both are broker.client.http_base's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from broker.client.http_base import HttpBase
from broker.wire_views import EventView, HealthView, JobView


class ThinClient(HttpBase):
    """`ThinClient(url, token)`: see the module."""

    def submit(self, data: dict[str, Any]) -> JobView:
        return JobView(self.post_job(data))

    def get(self, job_id: int) -> JobView:
        return JobView(self._req("GET", f"/v1/jobs/{int(job_id)}"))

    def cancel(self, job_id: int) -> JobView:
        return JobView(self._req("POST", f"/v1/jobs/{int(job_id)}/cancel"))

    def health(self) -> HealthView:
        return HealthView(self._req("GET", "/v1/healthz"))

    def events(self, job_id: int | None = None, user: str | None = None) -> list[EventView]:
        return [EventView(e) for e in self.event_rows(job_id, user)]

    def list(self, *, status: Iterable[str] | None = None, team: str | None = None,
             limit: int | None = None, newest: bool = False, user: str | None = None) -> list[JobView]:
        return [JobView(j) for j in self.job_pages(status=status, team=team, limit=limit, newest=newest,
                                                   user=user)]

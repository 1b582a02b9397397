"""The dashboard's reads over the API (GET /v1/dashboard..., broker.api.routes_dashboard) with
a token: the same answers as dashboard.data.LocalData gives on the server for that token's
principal. Imports nothing of the server."""

from __future__ import annotations

from urllib.parse import quote

from broker.client.http import HttpClient
from dashboard.wire import JobDetail, LogTail, Rows, Snapshot


class RemoteData:
    def __init__(self, http: HttpClient) -> None:
        self.http = http

    def snapshot(self, hours: float) -> Snapshot:
        return Snapshot.model_validate(self.http.read("/v1/dashboard", hours=hours))

    def experiment_jobs(self, experiment: str) -> Rows:
        return list(self.http.read(f"/v1/dashboard/experiments/{quote(experiment, safe='')}/jobs"))

    def job(self, job_id: int) -> JobDetail:
        return JobDetail.model_validate(self.http.read(f"/v1/dashboard/jobs/{int(job_id)}"))

    def log_tail(self, job_id: int, attempt: int) -> LogTail:
        return LogTail.model_validate(self.http.read(f"/v1/dashboard/jobs/{int(job_id)}/tail",
                                                     attempt=int(attempt)))

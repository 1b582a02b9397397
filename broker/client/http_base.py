"""The transport of the HTTP clients, without pydantic (issue 27: a CLI that starts fast):
requests with the token, retries of what is safe to send again, several server URLs
(broker.failover), and the server's errors raised as the same OnepoolError types the embedded
client raises. Answers are the server's JSON as is; broker.client.http.HttpClient (the SDK)
validates them into broker.wire's models, broker.client.views.ThinClient (the CLI's fast path)
reads them as they are.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, Self

# isort: off
from broker.client import httpx_lite  # noqa: F401  (first: it loads httpx without its CLI)
# isort: on
import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from broker.errors import (
    BudgetError,
    CheckpointError,
    Forbidden,
    InvalidState,
    NotConfigured,
    NotFound,
    OnepoolError,
    SpecError,
    TooLarge,
    TooManyRequests,
    Unauthorized,
    Unavailable,
)
from broker.failover import make_client, split_urls

_ERRORS: dict[str, type[OnepoolError]] = {c.__name__: c for c in (
    NotFound, InvalidState, NotConfigured, Unauthorized, Forbidden, BudgetError, CheckpointError,
    TooLarge, OnepoolError)}


class _Retry(Exception):
    """A failure worth retrying (connection dropped, 5xx)."""


def _raise_for(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        err = r.json()["error"]
        kind, msg = err["type"], err["message"]
    except (ValueError, KeyError, TypeError):
        raise OnepoolError(f"server answered {r.status_code}: {r.text[:300]}") from None
    if kind == "SpecError":
        raise SpecError(err.get("source", "request"), list(err.get("problems", [msg])))
    if kind == "TooManyRequests":
        wait = r.headers.get("retry-after", "1")
        raise TooManyRequests(msg, retry_after_s=int(wait) if wait.isdigit() else 1)
    raise _ERRORS.get(kind, OnepoolError)(msg)


class HttpBase:
    """`HttpBase(url, token)`: requests to an onepool server, JSON in and out. Raises
    Unavailable when the server cannot be reached. `url` may name several servers (URL1,URL2:
    a standby), tried in turn (broker.failover)."""

    def __init__(self, url: str, token: str | None, *, timeout: float = 30.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.code_uploads = 0  # code snapshots this client uploaded (upload_code)
        self.code_note: str | None = None  # what upload_code did last (the CLI shows it)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:  # several URLs (comma-separated): the one that answers (broker.failover)
            # a plain-HTTP server needs no TLS, so its client skips loading the CA bundle
            # (~30-70 ms of each CLI process; issue 27); https is verified
            tls = any(u.lower().startswith("https://") for u in split_urls(url))
            self.http = make_client(url, timeout, headers=headers,
                                    transport=transport or httpx.HTTPTransport(retries=2, verify=tls))
        except ValueError as e:
            raise SpecError("ONEPOOL_URL", [str(e)]) from None

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @retry(retry=retry_if_exception_type(_Retry), stop=stop_after_attempt(4),
           wait=wait_exponential(multiplier=0.2, max=2.0), reraise=True)
    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self.http.request(method, path, **kw)
        except httpx.TransportError as e:
            if method != "GET" and "Idempotency-Key" not in kw.get("headers", {}):
                raise Unavailable(f"cannot reach the onepool server at {self.url}: {e}") from None
            raise _Retry(str(e)) from None
        if r.status_code >= 500 and (method == "GET" or "Idempotency-Key" in kw.get("headers", {})):
            raise _Retry(f"{r.status_code}")
        _raise_for(r)
        return None if r.status_code == 204 else r.json()

    def _req(self, method: str, path: str, **kw: Any) -> Any:
        try:
            return self._call(method, path, **kw)
        except _Retry as e:
            raise Unavailable(f"the onepool server at {self.url} did not answer ({e}); "
                              "is `onepool server` running? check ONEPOOL_URL") from None

    def post_job(self, data: dict[str, Any], idempotency_key: str | None = None) -> Any:
        """POST /v1/jobs with an Idempotency-Key (yours, or a fresh one), so the retries made on
        a dropped connection or a 5xx never create a second job; the job as JSON."""
        if isinstance(data.get("code"), str):  # a folder: packed and uploaded first (issue 26)
            data = {**data, "code": self.upload_code(data["code"], data.get("team"))}
        key = idempotency_key or f"sdk-{uuid.uuid4()}"
        return self._req("POST", "/v1/jobs", json=data, headers={"Idempotency-Key": key})

    def upload_code(self, code: str, team: str | None = None) -> str:
        """A spec's `code` as the server takes it: a folder (broker.spec_code) is packed
        (broker.codepack) and uploaded unless the server holds that digest for the team
        already (asked first: a sweep from one folder uploads once); any other value is
        returned as is. Raises SpecError (a folder over the size limit: its largest files)."""
        from broker.codepack import EmptySnapshot, SnapshotTooLarge, pack, parse_code

        try:
            ref = parse_code(code)
        except ValueError as e:
            raise SpecError("job", [f"code: {e}"]) from None
        if ref.kind != "folder":
            return code
        try:
            snap = pack(os.path.abspath(os.path.expanduser(ref.folder or ".")))
        except (SnapshotTooLarge, EmptySnapshot, NotADirectoryError) as e:
            raise SpecError("job", [str(e)]) from None
        params = {"team": team} if team else {}
        path = f"/v1/code/{snap.sha256}"
        uploaded = not self._req("GET", path, params=params)["stored"]
        if uploaded:
            self._req("PUT", path, params=params, content=snap.data,
                      headers={"Content-Type": "application/octet-stream"}, timeout=300.0)
            self.code_uploads += 1
        self.code_note = (f"code: {snap.files} files, {len(snap.data)} bytes packed as {snap.ref}: "
                          + ("uploaded" if uploaded else "stored already, not uploaded"))
        return snap.ref

    def event_rows(self, job_id: int | None = None, user: str | None = None) -> list[Any]:
        """The events (of one job, or all; of the jobs `user` submitted) as JSON. Raises
        SpecError when given both a job and a user."""
        if user is not None and job_id is not None:
            raise SpecError("events", ["user: give a job id or a user, not both"])
        path = "/v1/events" if job_id is None else f"/v1/jobs/{int(job_id)}/events"
        got: list[Any] = self._req("GET", path, params={"user": user} if user else None)
        return got

    def counts(self, team: str | None = None) -> dict[str, int]:
        got = self._req("GET", "/v1/jobs/counts", params={"team": team} if team else None)
        return {str(k): int(v) for k, v in got.items()}

    def job_pages(self, *, status: Iterable[str] | None = None, team: str | None = None,
                  experiment: str | None = None, after_id: int = 0, limit: int | None = None,
                  finished_limit: int | None = None, newest: bool = False,
                  user: str | None = None) -> Iterator[dict[str, Any]]:
        """The jobs of GET /v1/jobs as JSON, page after page (one page of `limit` when given)."""
        while True:
            params: dict[str, Any] = {"after_id": after_id, "limit": min(limit or 1000, 1000)}
            if newest:
                params["newest"] = "true"
            if finished_limit is not None:
                params["finished_limit"] = finished_limit
            if status:
                params["status"] = list(status)
            if team:
                params["team"] = team
            if experiment:
                params["experiment"] = experiment
            if user:
                params["user"] = user
            page = self._req("GET", "/v1/jobs", params=params)
            yield from page["jobs"]
            if limit is not None or page["next_after_id"] is None:
                return
            after_id = page["next_after_id"]

    # -- other readers ------------------------------------------------------------------------
    def read(self, path: str, **params: Any) -> Any:
        """GET a JSON document of the API as this token (for readers with their own types: the
        dashboard, dashboard.remote), with the same retries and errors as every call here."""
        return self._req("GET", path, params=params)

"""The SDK over HTTP: the same methods as the embedded client (broker.client.sdk.Client), the
same return types and the same exceptions with the same messages, through the API of an
`onepool server` (ONEPOOL_URL) with a token (ONEPOOL_TOKEN).

Every submit carries an Idempotency-Key (yours, or a fresh one per call), so the retries
made on a dropped connection or a 5xx never create a second job.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

# isort: off
from broker.client import httpx_lite  # noqa: F401  (first: it loads httpx without its CLI)
# isort: on
import httpx
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from broker.client.estimate_info import EstimateInfo  # issue 29: plain pydantic
from broker.client.waits import wait_stopped
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
from broker.failover import CONNECT_TIMEOUT_S, make_client, split_urls
from broker.wire import (
    CostRow,
    EventInfo,
    Health,
    JobInfo,
    JoinTokenInfo,
    LogChunk,
    LostWorkRow,
    MoveInfo,
    NodeInfo,
    PoolInfo,
    ServerInfo,
    TeamBudget,
    TokenInfo,
)

if TYPE_CHECKING:  # broker.spec (pydantic models of the whole config) loads only where used:
    from broker.spec import ClusterConfig, JobSpec  # a submit over HTTP never needs it (issue 27)

_ERRORS: dict[str, type[OnepoolError]] = {c.__name__: c for c in (
    NotFound, InvalidState, NotConfigured, Unauthorized, Forbidden, BudgetError, CheckpointError,
    TooLarge, OnepoolError)}


def _spec_data(spec: JobSpec | dict[str, Any] | None) -> dict[str, Any]:
    """A submit's fields from a JobSpec (whose module its caller has loaded), a dict or None.
    Raises SpecError for anything else."""
    if spec is None:
        return {}
    if isinstance(spec, dict):
        return dict(spec)
    loaded = sys.modules.get("broker.spec")
    if loaded is not None and isinstance(spec, loaded.JobSpec):
        return spec.model_dump(mode="json")
    raise SpecError("job", [f"(root): expected a JobSpec or a dict, got {type(spec).__name__}"])


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


class HttpClient:
    """`HttpClient(url, token)`; raises Unavailable when the server cannot be reached. `url`
    may name several servers (URL1,URL2: a standby), tried in turn (broker.failover)."""

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

    def __enter__(self) -> HttpClient:
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

    # -- configuration ----------------------------------------------------------------------
    def apply(self, config: ClusterConfig | str | Path) -> ClusterConfig:
        from broker.spec import ClusterConfig, load_config

        cfg = config if isinstance(config, ClusterConfig) else load_config(config)
        return ClusterConfig.model_validate(self._req("PUT", "/v1/config", json=cfg.model_dump(mode="json")))

    def config(self) -> ClusterConfig:
        from broker.spec import ClusterConfig

        return ClusterConfig.model_validate(self._req("GET", "/v1/config"))

    # -- jobs -------------------------------------------------------------------------------
    def submit(self, spec: JobSpec | dict[str, Any] | None = None, /, *,
               priority: str | None = None, budget_usd: float | None = None,
               idempotency_key: str | None = None, **fields: Any) -> JobInfo:
        data = _spec_data(spec)
        data.update(fields)
        if priority is not None:
            data["priority"] = priority
        if budget_usd is not None:
            data["budget_usd"] = budget_usd
        if isinstance(data.get("code"), str):  # a folder: packed and uploaded first (issue 26)
            data["code"] = self.upload_code(data["code"], data.get("team"))
        key = idempotency_key or f"sdk-{uuid.uuid4()}"
        return JobInfo.model_validate(self._req("POST", "/v1/jobs", json=data,
                                                headers={"Idempotency-Key": key}))

    def get(self, job_id: int) -> JobInfo:
        return JobInfo.model_validate(self._req("GET", f"/v1/jobs/{int(job_id)}"))

    def upload_code(self, code: str, team: str | None = None) -> str:
        """A spec's `code` as the server takes it: a folder (broker.spec_code) is packed
        (broker.codepack) and uploaded unless the server holds that digest for the team
        already (asked first: a sweep from one folder uploads once); any other value is
        returned as is. Raises SpecError (a folder over the size limit: its largest files)."""
        from broker.codepack import SnapshotTooLarge, pack
        from broker.spec_code import parse_code

        try:
            ref = parse_code(code)
        except ValueError as e:
            raise SpecError("job", [f"code: {e}"]) from None
        if ref.kind != "folder":
            return code
        try:
            snap = pack(os.path.abspath(os.path.expanduser(ref.folder or ".")))
        except (SnapshotTooLarge, NotADirectoryError) as e:
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

    def estimate(self, spec: JobSpec | dict[str, Any] | None = None, /, **fields: Any) -> EstimateInfo:
        data = _spec_data(spec)
        data.update(fields)
        return EstimateInfo.model_validate(self._req("POST", "/v1/estimate", json=data))

    def estimates(self, job_ids: list[int]) -> list[EstimateInfo]:
        if not job_ids:
            return []
        rows = self._req("GET", "/v1/estimates", params={"job_id": [int(j) for j in job_ids]})
        return [EstimateInfo.model_validate(r) for r in rows]

    def list(self, *, status: Iterable[str] | None = None, team: str | None = None,
             experiment: str | None = None, after_id: int = 0,
             limit: int | None = None, finished_limit: int | None = None,
             newest: bool = False, user: str | None = None) -> list[JobInfo]:
        out: list[JobInfo] = []
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
            out += [JobInfo.model_validate(j) for j in page["jobs"]]
            if limit is not None or page["next_after_id"] is None:
                return out
            after_id = page["next_after_id"]

    def counts(self, team: str | None = None) -> dict[str, int]:
        got = self._req("GET", "/v1/jobs/counts", params={"team": team} if team else None)
        return {str(k): int(v) for k, v in got.items()}

    def cancel(self, job_id: int) -> JobInfo:
        return JobInfo.model_validate(self._req("POST", f"/v1/jobs/{int(job_id)}/cancel"))

    def events(self, job_id: int | None = None, user: str | None = None) -> list[EventInfo]:
        if user is not None and job_id is not None:
            raise SpecError("events", ["user: give a job id or a user, not both"])
        path = "/v1/events" if job_id is None else f"/v1/jobs/{int(job_id)}/events"
        params = {"user": user} if user else None
        return [EventInfo.model_validate(e) for e in self._req("GET", path, params=params)]

    def update(self, job_id: int, *, priority: str | None = None,
               budget_usd: float | None = None) -> JobInfo:
        body = {k: v for k, v in (("priority", priority), ("budget_usd", budget_usd)) if v is not None}
        return JobInfo.model_validate(self._req("PATCH", f"/v1/jobs/{int(job_id)}", json=body))

    def hold(self, job_id: int) -> JobInfo:
        return JobInfo.model_validate(self._req("POST", f"/v1/jobs/{int(job_id)}/hold"))

    def release(self, job_id: int) -> JobInfo:
        return JobInfo.model_validate(self._req("POST", f"/v1/jobs/{int(job_id)}/release"))

    def logs(self, job_id: int, attempt: int | None = None, rank: int = 0,
             offset: int = 0) -> LogChunk:
        params = {"rank": rank, "offset": offset, **({"attempt": attempt} if attempt else {})}
        return LogChunk.model_validate(self._req("GET", f"/v1/jobs/{int(job_id)}/logs", params=params))

    def lost_work(self, by: str = "team") -> list[LostWorkRow]:
        return [LostWorkRow.model_validate(r) for r in self._req("GET", "/v1/lost", params={"by": by})]

    def costs(self, by: str = "experiment", since: float | None = None,
              until: float | None = None) -> list[CostRow]:
        params = {"by": by, **({"since": since} if since is not None else {}),
                  **({"until": until} if until is not None else {})}
        return [CostRow.model_validate(r) for r in self._req("GET", "/v1/costs", params=params)]

    def set_budget(self, amount_usd: float, *, job_id: int | None = None,
                   team: str | None = None) -> str:
        if (job_id is None) == (team is None):
            raise SpecError("budget", ["give a job id or a team (exactly one)"])
        path = f"/v1/jobs/{int(job_id)}/budget" if job_id is not None else f"/v1/budgets/teams/{team}"
        return str(self._req("PUT", path, json={"usd": amount_usd})["message"])

    def budgets(self) -> list[TeamBudget]:
        return [TeamBudget(**b) for b in self._req("GET", "/v1/budgets")]

    def wait(self, job_ids: Iterable[int], timeout: float = 3600.0,
             poll_s: float = 0.5) -> list[JobInfo]:
        """Block until every job has ended (or stopped as BUDGET_EXHAUSTED). Raises
        TimeoutError naming the ones still open."""
        return wait_stopped(self.get, job_ids, timeout, poll_s)

    # -- tokens, nodes, health ---------------------------------------------------------------
    def create_token(self, team: str, role: str = "member", note: str = "",
                     user: str | None = None) -> TokenInfo:
        body = {"team": team, "role": role, "note": note, **({"user": user} if user else {})}
        return TokenInfo.model_validate(self._req("POST", "/v1/tokens", json=body))

    def revoke_token(self, token_id: str) -> TokenInfo:
        return TokenInfo.model_validate(self._req("POST", f"/v1/tokens/{token_id}/revoke"))

    def tokens(self) -> list[TokenInfo]:
        return [TokenInfo.model_validate(t) for t in self._req("GET", "/v1/tokens")]

    def join_token(self, node: str, ttl_s: float = 3600.0) -> JoinTokenInfo:
        return JoinTokenInfo.model_validate(self._req("POST", f"/v1/nodes/{node}/join-token",
                                                      json={"ttl_s": ttl_s}))

    def nodes(self, pool: str | None = None) -> list[NodeInfo]:
        params = {"pool": pool} if pool else {}
        return [NodeInfo.model_validate(n) for n in self._req("GET", "/v1/nodes", params=params)]

    def pools(self, *, include_inactive: bool = False) -> list[PoolInfo]:
        params = {"include_inactive": "true"} if include_inactive else {}
        return [PoolInfo.model_validate(p) for p in self._req("GET", "/v1/pools", params=params)]

    def replay(self, sets: list[str] | None = None, config: dict[str, Any] | None = None,
               since: float | None = None) -> dict[str, Any]:
        out: dict[str, Any] = self._req("POST", "/v1/replay", json={
            "sets": list(sets or []), "config": config, "since": since})
        return out

    def rebalance_history(self, limit: int = 200) -> dict[str, Any]:
        out: dict[str, Any] = self._req("GET", "/v1/rebalance/history", params={"limit": limit})
        return out

    def rebalance_dry_run(self) -> list[MoveInfo]:
        return [MoveInfo.model_validate(m) for m in self._req("GET", "/v1/rebalance/proposals")]

    def health(self) -> Health:
        """The broker's health; with several server URLs, also each one's answer (`servers`:
        leader, standby, or down with the error), asked directly, without failover."""
        h = Health.model_validate(self._req("GET", "/v1/healthz"))
        urls = split_urls(self.url)
        if len(urls) < 2:
            return h
        servers = []
        for u in urls:
            try:
                r = httpx.get(f"{u}/v1/healthz", timeout=httpx.Timeout(10.0, connect=CONNECT_TIMEOUT_S))
                r.raise_for_status()
                by = Health.model_validate(r.json()).served_by
                servers.append(ServerInfo(url=u, role=h.role_of(by), served_by=by))
            except (httpx.HTTPError, ValueError) as e:
                servers.append(ServerInfo(url=u, role="down", error=f"{type(e).__name__}: {e}"[:200]))
        return h.model_copy(update={"servers": servers})

    # -- other readers ------------------------------------------------------------------------
    def read(self, path: str, **params: Any) -> Any:
        """GET a JSON document of the API as this token (for readers with their own types: the
        dashboard, dashboard.remote), with the same retries and errors as every call here."""
        return self._req("GET", path, params=params)

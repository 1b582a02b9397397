"""The SDK over HTTP: the same methods as the embedded client (broker.client.sdk.Client), the
same return types and the same exceptions with the same messages, through the API of an
`onepool server` (ONEPOOL_URL) with a token (ONEPOOL_TOKEN). The transport (retries, failover,
errors) is broker.client.http_base's; this module validates the answers into broker.wire's models.

Every submit carries an Idempotency-Key (yours, or a fresh one per call), so the retries
made on a dropped connection or a 5xx never create a second job.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from broker.client.estimate_info import EstimateInfo  # issue 29: plain pydantic
from broker.client.http_base import HttpBase, httpx  # httpx as http_base loads it (without its CLI)
from broker.client.waits import wait_stopped
from broker.errors import SpecError
from broker.failover import CONNECT_TIMEOUT_S, split_urls
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


class HttpClient(HttpBase):
    """`HttpClient(url, token)`: the SDK over HTTP (see the module); raises Unavailable when the
    server cannot be reached. `url` may name several servers (URL1,URL2: a standby), tried in
    turn (broker.failover)."""

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
        return JobInfo.model_validate(self.post_job(data, idempotency_key))

    def get(self, job_id: int) -> JobInfo:
        return JobInfo.model_validate(self._req("GET", f"/v1/jobs/{int(job_id)}"))

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
        return [JobInfo.model_validate(j) for j in self.job_pages(
            status=status, team=team, experiment=experiment, after_id=after_id, limit=limit,
            finished_limit=finished_limit, newest=newest, user=user)]

    def cancel(self, job_id: int) -> JobInfo:
        return JobInfo.model_validate(self._req("POST", f"/v1/jobs/{int(job_id)}/cancel"))

    def events(self, job_id: int | None = None, user: str | None = None) -> list[EventInfo]:
        return [EventInfo.model_validate(e) for e in self.event_rows(job_id, user)]

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

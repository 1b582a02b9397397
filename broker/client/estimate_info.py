"""The answer of an estimate (issue 29), as the SDK, the API and the HTTP client share it: plain
pydantic, importing nothing of the server (the HTTP client's import contract)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

MAX_ESTIMATES = 50  # pending jobs estimated per call at most (each is a replay of the queue)


class EstimateInfo(BaseModel):
    """When a job would start and what it would cost (issue 29, broker.policy.forecast): its
    pool, GPU type and market, its start (epoch s) at p10/p50/p90 and the wait to the p50,
    its runtime as estimated, and its cost, expected and with the spot interruption risk.
    Start and cost None: the replay did not start it within its horizon."""

    model_config = ConfigDict(defer_build=True)
    job_id: int | None  # None: a job not submitted (`submit --dry-run`)
    pool: str | None
    gpu_type: str | None
    market: str | None
    start_p10: float | None
    start_p50: float | None
    start_p90: float | None
    wait_p50_s: float | None
    runtime_s: float
    cost_usd: float | None
    cost_with_risk_usd: float | None

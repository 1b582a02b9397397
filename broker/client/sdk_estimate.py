"""The SDK's estimates (issue 29): when a job would start and what it would cost, before it is
submitted (`Client.estimate`, `onepool submit --dry-run`) or while it waits
(`Client.estimates`, `onepool status --estimate`). Read-only; see broker.control.estimate."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from broker.client.estimate_info import MAX_ESTIMATES
from broker.errors import SpecError
from broker.spec import JobSpec, check_job_fits

if TYPE_CHECKING:
    from broker.client.estimate_info import EstimateInfo
    from broker.client.sdk import Client



class EstimateMixin:
    def estimate(self: Client, spec: JobSpec | dict[str, Any] | None = None, /,
                 **fields: Any) -> EstimateInfo:
        """The pool, start (p10/p50/p90) and cost the job would get if submitted now (an
        array's first element), writing nothing. Raises as submit() does for a bad spec."""
        from broker.control.estimate import estimate_new, info

        data: dict[str, Any] = spec.model_dump() if isinstance(spec, JobSpec) else dict(spec or {})
        data.update(fields)
        js = self.prepare(data)
        now = self.clock.now()
        with self.store.session() as s:
            cfg = self.config()
            check_job_fits(js, cfg)
            return info(estimate_new(s, cfg, js, now), now, None)

    def estimates(self: Client, job_ids: list[int]) -> list[EstimateInfo]:
        """The estimates of these pending jobs (at most MAX_ESTIMATES; jobs not pending, held
        by a dependency, a backoff or their array's limit, are left out). Raises NotFound,
        Forbidden as get() does."""
        from broker.control.estimate import estimate_pending, info

        if len(job_ids) > MAX_ESTIMATES:
            raise SpecError("estimate", [f"job_ids: at most {MAX_ESTIMATES} at once (got {len(job_ids)})"])
        now = self.clock.now()
        with self.store.session() as s:
            for j in job_ids:
                self._job(s, j)
            found = estimate_pending(s, self.config(), job_ids, now)
            return [info(f, now, j) for j, f in found.items()]

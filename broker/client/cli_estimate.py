"""How the CLI prints estimates (issue 29): `onepool submit --dry-run` and
`onepool status --estimate` (broker.client.sdk_estimate)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker.wire import fmt_usd

if TYPE_CHECKING:
    from rich.table import Table

    from broker.client.estimate_info import EstimateInfo


def _wait(s: float | None) -> str:
    if s is None:
        return "not within 14 days"
    if s < 60:
        return "now" if s < 1 else f"{s:.0f}s"
    return f"{s / 60:.0f} min" if s < 3600 else f"{s / 3600:.1f} h"


def summary(e: EstimateInfo, ts: Callable[[float | None], str]) -> str:
    """One paragraph: where, when (p50, and the p10-p90 band), what it costs."""
    if e.pool is None or e.start_p50 is None:
        return "estimate: the replay of the queue does not start this job within 14 days"
    band = f"{ts(e.start_p10)} to {ts(e.start_p90)}"
    cost = ("" if e.cost_usd is None else f"; cost {fmt_usd(e.cost_usd)} for {e.runtime_s / 3600:.2f} h"
            + ("" if e.cost_with_risk_usd is None or e.cost_with_risk_usd == e.cost_usd
               else f" ({fmt_usd(e.cost_with_risk_usd)} with the spot interruption risk)"))
    return (f"estimate: pool {e.pool} ({e.gpu_type}, {e.market}); starts in {_wait(e.wait_p50_s)} "
            f"(p50 {ts(e.start_p50)}, p10-p90 {band}){cost}")


def table(estimates: list[EstimateInfo], ts: Callable[[float | None], str],
          make: Callable[..., Table]) -> Table:
    t = make("estimates of pending jobs", ["job", "pool", "GPU", "market", "wait p50", "start p10",
                                           "start p50", "start p90", "runtime h", "cost", "with risk"],
             right=("job", "runtime h", "cost", "with risk"))
    for e in estimates:
        t.add_row(str(e.job_id), e.pool or "", e.gpu_type or "", e.market or "", _wait(e.wait_p50_s),
                  ts(e.start_p10), ts(e.start_p50), ts(e.start_p90), f"{e.runtime_s / 3600:.2f}",
                  "" if e.cost_usd is None else fmt_usd(e.cost_usd),
                  "" if e.cost_with_risk_usd is None else fmt_usd(e.cost_with_risk_usd))
    return t

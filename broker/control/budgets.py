"""Dollar budgets that hold: estimated at submission, enforced on the leader's schedule (or
every cycle, broker.control.duties), raised by hand.

Contract:

- A job's spend is what the ledger charged it (its GPU share, on-prem amortized included, and
  its checkpoint egress). When spend >= `budget_usd`, its running attempt is stopped with
  reason "budget" (SIGTERM: the runtime checkpoints and exits) and the job ends as
  BUDGET_EXHAUSTED. `set_job_budget` above the spend puts it back in the queue; it resumes
  from that checkpoint.
- A team's spend is what its jobs (and idle rented time charged to it) cost in the current
  calendar window (UTC day, ISO week, month, or "total"). With less than
  `budget_low_fraction` of the amount left it is LOW: its pending work goes spot-only and it
  loses its urgent/high allowance (`restrict`). At zero it is EXHAUSTED: its running jobs
  stop as BUDGET_EXHAUSTED and nothing new of it is placed. `set_team_budget` overrides the
  config's amount (until the next override) and resumes its budget-stopped jobs.
- Submission: `check_submission` estimates the cost from the expected duration (the spec's,
  else the mean of the team's finished jobs of that experiment) on the cheapest feasible pool
  that is not spot (spot is a discount, not a promise; spot pools only if nothing else fits).
  Over budget: queued spot-only when a spot pool fits and the job allows spot (and the
  broker's `over_budget_submission` is "spot_only"), else refused with BudgetError naming the
  estimate and the budget. An exhausted team's submissions are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import func
from sqlmodel import Session, col, select

from broker.errors import BudgetError, InvalidState, NotFound, SpecError, Unpriced
from broker.policy import Snapshot
from broker.policy import budget as policy_budget
from broker.policy.budget import team_budget_state
from broker.spec import ClusterConfig, JobSpec, Market, SpotPolicy, market_ok
from broker.state.events import record
from broker.state.ledger import price_in_force, spend_by_job, usd_per_gpu_hour
from broker.state.model import Attempt, AttemptState, Job, JobState, LedgerEntry, Pool, Setting
from broker.wire import TeamBudget, fmt_usd

OVERRIDE = "budget:team:"


@dataclass(frozen=True)
class Estimate:
    usd: float
    duration_s: float
    duration_from: str  # "expected_duration_s" | "history of <team>/<experiment>"
    pool: str
    usd_per_gpu_hour: float


def window_bounds(window: str, now: float) -> tuple[float, float | None]:
    """[start, end) of the calendar window (UTC) holding `now`; "total" is [0, None)."""
    d = datetime.fromtimestamp(now, UTC)
    if window == "total":
        return 0.0, None
    if window == "day":
        start = d.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.timestamp(), (start + timedelta(days=1)).timestamp()
    if window == "week":
        start = (d - timedelta(days=d.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
        return start.timestamp(), (start + timedelta(days=7)).timestamp()
    if window == "month":
        start = d.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        nxt = start.replace(year=start.year + (start.month == 12), month=start.month % 12 + 1)
        return start.timestamp(), nxt.timestamp()
    raise ValueError(f"budget window must be day, week, month or total (got {window!r})")


def team_spend(s: Session, team: str, since: float, until: float | None = None) -> float:
    """USD charged to the team from `since` (rows are counted by their start)."""
    q = select(func.coalesce(func.sum(LedgerEntry.usd), 0.0)).where(LedgerEntry.team == team,
                                                                    LedgerEntry.start >= since)
    if until is not None:
        q = q.where(LedgerEntry.start < until)
    return float(s.exec(q).one())


def team_budgets(s: Session, cfg: ClusterConfig, now: float) -> list[TeamBudget]:
    """Every configured team's budget state at `now`."""
    out = []
    for t in cfg.teams:
        override = s.get(Setting, OVERRIDE + t.name)
        amount = override.value["usd"] if override is not None else t.budget_usd
        start, end = window_bounds(t.budget_window, now)
        spent = team_spend(s, t.name, start, end)
        state = team_budget_state(amount, spent, t.budget_low_fraction)
        out.append(TeamBudget(t.name, amount, t.budget_window, start, end, spent, state,
                              t.budget_low_fraction))
    return out


def restrict(snap: Snapshot, budgets: list[TeamBudget]) -> Snapshot:
    """The snapshot the policy sees under team budgets: broker.policy.budget.restrict (LOW
    teams' pending jobs are spot-only and their high/urgent allowance is 0; EXHAUSTED teams'
    pending jobs are hidden)."""
    return policy_budget.restrict(snap, {b.team: b.state for b in budgets})


StopFn = Callable[[Session, Attempt, float, str], None]


def enforce(s: Session, cfg: ClusterConfig, now: float, stop: StopFn,
            previous: dict[str, str] | None = None) -> list[TeamBudget]:
    """Stop (reason "budget") running attempts of jobs whose spend reached their budget and of
    teams whose window budget is spent; record team state changes (against `previous`)."""
    budgets = team_budgets(s, cfg, now)
    for b in budgets:
        if previous is not None and previous.get(b.team, "ok") != b.state and b.state in ("low",
                                                                                        "exhausted"):
            record(s, now, f"team_budget_{b.state}", f"team {b.team} has spent ${b.spent:.2f} of its "
                   f"${b.amount:.2f} {b.window} budget: " + (
                       "new work is spot-only and its urgent allowance is gone" if b.state == "low"
                       else "its jobs stop; raise it with `onepool budget set --team`"),
                   team=b.team, spent=b.spent, amount=b.amount)
    exhausted = {b.team for b in budgets if b.state == "exhausted"}
    running = s.exec(select(Attempt, Job).join(Job, Job.id == Attempt.job_id)
                     .where(Attempt.state == AttemptState.RUNNING)).all()
    spend = spend_by_job(s, [j.id for _, j in running if j.budget_usd is not None and j.id])
    for a, j in running:
        over_job = j.budget_usd is not None and spend.get(j.id or 0, 0.0) >= j.budget_usd
        if over_job or j.team in exhausted:
            why = (f"job spent ${spend.get(j.id or 0, 0.0):.4f} of its ${j.budget_usd:.4f} budget"
                   if over_job else f"team {j.team}'s budget is spent")
            record(s, now, "budget_stop", f"{why}: final checkpoint, then BUDGET_EXHAUSTED",
                   job_id=j.id, attempt_id=a.id)
            stop(s, a, now, "budget")
    return budgets


def estimate(s: Session, cfg: ClusterConfig, js: JobSpec, now: float,
             spot: SpotPolicy | None = None) -> Estimate | None:
    """The cheapest feasible placement's cost for the job's expected duration; None when no
    duration is known (no field, no history) or no pool fits."""
    duration, source = js.expected_duration_s, "expected_duration_s"
    if duration is None:
        duration = _history_duration(s, js.team, js.experiment)
        source = f"the mean of team {js.team}'s finished {js.experiment} jobs"
    if duration is None:
        return None
    best: Estimate | None = None
    for p in cfg.pools:
        if js.gpu_types and p.gpu_type not in js.gpu_types:
            continue
        if not market_ok(spot or js.spot, p.market) or (spot is SpotPolicy.ONLY
                                                         and p.market is not Market.SPOT):
            continue
        if p.gpus_per_node < js.gpus_per_node or p.nodes < js.nodes:
            continue
        row = s.get(Pool, p.name)
        if row is None or not row.active:
            continue
        try:
            rate = usd_per_gpu_hour(row, price_in_force(s, row, now, cfg), cfg)
        except Unpriced:  # refused at apply; a catalog changed since: no estimate on it
            continue
        usd = rate * js.gpus * duration / 3600.0
        if best is None or usd < best.usd:
            best = Estimate(usd, duration, source, p.name, rate)
    return best


def _history_duration(s: Session, team: str, experiment: str) -> float | None:
    rows = s.exec(select(Attempt.job_id, Attempt.started_at, Attempt.ended_at)
                  .join(Job, Job.id == Attempt.job_id)
                  .where(Job.team == team, Job.experiment == experiment,
                         Job.state == JobState.SUCCEEDED, col(Attempt.ended_at).is_not(None))).all()
    per_job: dict[int, float] = {}
    for jid, start, end in rows:
        per_job[jid] = per_job.get(jid, 0.0) + (end - start)
    return sum(per_job.values()) / len(per_job) if per_job else None


def check_submission(s: Session, cfg: ClusterConfig, js: JobSpec, now: float,
                     overridden: set[str] | None = None) -> tuple[JobSpec, str | None]:
    """The spec to queue and a note saying why it changed (None: unchanged). `overridden`:
    the teams with a budget override, as overridden_teams() read them (None: read here).
    Raises BudgetError naming the estimate and the budget when it cannot fit."""
    team = next((t for t in cfg.teams if t.name == js.team), None)
    has_override = (js.team in overridden if overridden is not None
                    else s.get(Setting, OVERRIDE + js.team) is not None)
    budgeted = team is not None and (team.budget_usd is not None or has_override)
    tb = next((b for b in team_budgets(s, cfg, now) if b.team == js.team), None) if budgeted else None
    if tb is not None and tb.state == "exhausted":
        raise BudgetError(f"team {js.team} has spent {fmt_usd(tb.spent)} of its "
                          f"{fmt_usd(tb.amount or 0.0)} {tb.window} budget; raise it with `onepool "
                          f"budget set --team {js.team} AMOUNT` before submitting more work")
    if js.budget_usd is None:
        return js, None
    # Spot is a discount, not a promise: estimate on reliable capacity when there is some.
    est = None if js.spot is SpotPolicy.ONLY else estimate(
        s, cfg, js.model_copy(update={"spot": SpotPolicy.NEVER}), now)
    est = est or estimate(s, cfg, js, now)
    if est is None or est.usd <= js.budget_usd:
        return js, None
    spot = None
    if cfg.broker.over_budget_submission == "spot_only" and js.spot is not SpotPolicy.NEVER:
        spot = estimate(s, cfg, js, now, SpotPolicy.ONLY)
    if spot is not None and spot.usd <= js.budget_usd:
        return js.model_copy(update={"spot": SpotPolicy.ONLY}), (
            f"queued spot-only: the estimate {fmt_usd(est.usd)} on {est.pool} exceeds the budget "
            f"{fmt_usd(js.budget_usd)}; on spot pool {spot.pool} it is {fmt_usd(spot.usd)}")
    zero = " (a budget of $0 allows no spending at all)" if js.budget_usd == 0 else ""
    raise BudgetError(
        f"job {js.name}: estimated cost {fmt_usd(est.usd)} exceeds its budget "
        f"{fmt_usd(js.budget_usd)}{zero} ({js.gpus} GPUs x {est.duration_s / 3600:.2f} h at "
        f"{fmt_usd(est.usd_per_gpu_hour)}/GPU-h on {est.pool}, the cheapest pool that fits; duration "
        f"from {est.duration_from}); raise --budget-usd to at least {_ceil_cents(est.usd)}, shorten "
        "expected_duration_s, or allow spot")


def overridden_teams(s: Session) -> set[str]:
    """The teams whose budget an admin overrode (`onepool budget set --team`)."""
    # A range over the primary key (not LIKE, which scans): every key that starts with OVERRIDE.
    upper = OVERRIDE[:-1] + chr(ord(OVERRIDE[-1]) + 1)
    keys = s.exec(select(Setting.key).where(col(Setting.key) >= OVERRIDE, col(Setting.key) < upper)).all()
    return {k.removeprefix(OVERRIDE) for k in keys}


def _ceil_cents(usd: float) -> str:
    """The smallest amount in whole cents that covers `usd` (what to type as a budget)."""
    return f"{math.ceil(usd * 100 - 1e-9) / 100:.2f}"


def set_job_budget(s: Session, job_id: int, usd: float, now: float) -> str:
    """Set a job's budget; a BUDGET_EXHAUSTED job goes back to the queue. Returns what happened.
    Raises NotFound, SpecError (negative), or InvalidState if the job already spent more."""
    if usd < 0:
        raise SpecError("budget", [f"amount: a budget cannot be negative (got {usd:g})"])
    j = s.get(Job, job_id)
    if j is None:
        raise NotFound(f"no job with id {job_id}")
    spent = spend_by_job(s, [job_id]).get(job_id, 0.0)
    if j.state == JobState.BUDGET_EXHAUSTED and usd <= spent:
        raise InvalidState(f"job {job_id} has already spent ${spent:.4f}; a budget of ${usd:.4f} "
                           f"would stop it again: give more than ${spent:.4f}")
    j.budget_usd = usd
    msg = f"budget set to ${usd:.4f} (spent so far ${spent:.4f})"
    if j.state == JobState.BUDGET_EXHAUSTED:
        j.state, j.queued_at, j.end_time = JobState.PENDING, now, None
        msg += "; back in the queue, it resumes from its last checkpoint"
    s.add(j)
    record(s, now, "budget_set", msg, job_id=job_id, usd=usd, spent=spent)
    return msg


def set_team_budget(s: Session, cfg: ClusterConfig, team: str, usd: float, now: float) -> str:
    """Override a team's window budget; if no longer exhausted, requeue its jobs that were
    stopped for budget and whose own budget still has room. Raises NotFound, SpecError."""
    if usd < 0:
        raise SpecError("budget", [f"amount: a budget cannot be negative (got {usd:g})"])
    if team not in [t.name for t in cfg.teams]:
        raise NotFound(f"no team {team!r}; teams: {', '.join(t.name for t in cfg.teams)}")
    row = s.get(Setting, OVERRIDE + team) or Setting(key=OVERRIDE + team)
    row.value = {"usd": usd, "set_at": now}
    s.add(row)
    s.flush()
    tb = next(b for b in team_budgets(s, cfg, now) if b.team == team)
    msg = f"team {team}: {tb.window} budget ${usd:.2f}, spent ${tb.spent:.2f} ({tb.state})"
    if tb.state != "exhausted":
        stopped = s.exec(select(Job).where(Job.team == team,
                                           Job.state == JobState.BUDGET_EXHAUSTED)).all()
        spend = spend_by_job(s, [j.id for j in stopped if j.id])
        resumed = []
        for j in stopped:
            if j.budget_usd is None or spend.get(j.id or 0, 0.0) < j.budget_usd:
                j.state, j.queued_at, j.end_time = JobState.PENDING, now, None
                s.add(j)
                resumed.append(j.id)
        if resumed:
            msg += f"; back in the queue: jobs {', '.join(map(str, resumed))}"
    record(s, now, "team_budget_set", msg, team=team, usd=usd)
    return msg


def projected_end(b: TeamBudget, burn_usd_per_h: float, now: float) -> float | None:
    """When the team's budget runs out at the current burn rate (None: no budget or no burn)."""
    if b.amount is None or burn_usd_per_h <= 0:
        return None
    return now + max(0.0, b.amount - b.spent) / burn_usd_per_h * 3600.0


def charge(s: Session, now: float) -> ClusterConfig:
    """Charge the ledger up to `now` (committed); returns the applied config. Charging twice
    at the same `now` charges nothing more."""
    from broker.control.config_apply import applied_config
    from broker.state.ledger import accrue

    cfg = applied_config(s)
    accrue(s, now, cfg)
    s.commit()
    return cfg
